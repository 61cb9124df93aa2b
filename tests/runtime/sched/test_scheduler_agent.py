"""A simulated agent workload: G system prompts x U users, 2 turns each, users interleaved.

The second turn of a user is its first turn's prompt + answer + a new message and is
submitted when the first turn finishes (as an agent loop does). The KV pool holds about
two system prompts and two requests run at a time, so the cache must be used before
eviction takes it: `lpm` gets within 5 points of the best possible hit rate, `fcfs`
(round-robin over groups) keeps evicting the prefix it needs next.
"""

from __future__ import annotations

import random

import pytest

from radixlm import Engine
from radixlm.radix.policy import make_policy
from radixlm.runtime.sched.stats import SchedulerCounters
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool, make_req

GROUPS, USERS, SYSTEM, MSG, NEW = 4, 4, 64, 8, 4  # 16 users x 2 turns = 32 requests


def _workload(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Turn-1 prompts in arrival order (users interleaved across groups) and the
    second-turn messages, random non-special token ids."""
    rng = random.Random(seed)
    pool = range(100, 40000)
    systems = [rng.sample(pool, SYSTEM) for _ in range(GROUPS)]
    turn1 = [systems[g] + rng.sample(pool, MSG) for _ in range(USERS) for g in range(GROUPS)]
    msgs = [rng.sample(pool, MSG) for _ in turn1]
    return turn1, msgs


class _Trie:
    """Counts tokens not seen before: the prefill work of an infinite prefix cache."""

    def __init__(self):
        self.root: dict = {}

    def add(self, ids: list[int]) -> int:
        node, new = self.root, 0
        for t in ids:
            if t not in node:
                node[t] = {}
                new += 1
            node = node[t]
        return new


def _optimal_hit_rate(turn1, outs1, msgs) -> float:
    """Cached / prompt tokens with an infinite cache: every token computed once, except
    that a prompt's last token always runs; turn-1 answers were computed while decoding
    (all but the last answer token have KV)."""
    trie, prompt_tokens, computed = _Trie(), 0, 0
    for ids in turn1:
        prompt_tokens += len(ids)
        computed += max(trie.add(ids[:-1]), 0) + 1
    for ids, out in zip(turn1, outs1):
        trie.add(ids + out[:-1])
    for ids, out, msg in zip(turn1, outs1, msgs):
        p2 = ids + out + msg
        prompt_tokens += len(p2)
        computed += trie.add(p2[:-1]) + 1
    return 1 - computed / prompt_tokens


def _run(engine, policy: str) -> tuple[dict, list[list[int]]]:
    turn1, msgs = _workload()
    sched = engine.scheduler
    sched.tree.evict(sched.tree.evictable_size())
    sched.policy = make_policy(policy, sched.tree)
    sched.counters = SchedulerCounters()
    reqs = [make_req(ids, NEW, ignore_eos=True) for ids in turn1]
    index = {r.rid: i for i, r in enumerate(reqs)}
    for r in reqs:
        sched.add_request(r)
    outs1: list[list[int]] = [[] for _ in turn1]
    while sched.waiting or sched.running or sched.chunked:
        for o in sched.step():
            i = index.get(o.rid)
            if i is None:
                continue
            outs1[i] += o.new_token_ids
            if o.finish_reason is not None:  # the agent's next turn
                turn2 = turn1[i] + outs1[i] + msgs[i]
                sched.add_request(make_req(turn2, NEW, ignore_eos=True))
    check_pool(sched, idle=True)
    return sched.stats(), outs1


@pytest.fixture(scope="module")
def results():
    with Engine(MODEL, max_total_tokens=192, max_running_requests=2) as engine:
        return {p: _run(engine, p) for p in ("lpm", "fcfs")}


def test_lpm_hit_rate_near_optimal(results):
    stats, outs1 = results["lpm"]
    turn1, msgs = _workload()
    best = _optimal_hit_rate(turn1, outs1, msgs)
    assert stats["prompt_tokens_total"] == sum(len(p) for p in turn1) + sum(
        len(p) + NEW + MSG for p in turn1
    )
    assert stats["cache_hit_rate"] >= best - 0.05, (stats["cache_hit_rate"], best)
    assert stats["cache_hit_rate"] <= best + 1e-9


def test_lpm_beats_fcfs_on_prefill(results):
    lpm, fcfs = results["lpm"][0], results["fcfs"][0]
    assert lpm["prefill_tokens_total"] < 0.8 * fcfs["prefill_tokens_total"], (lpm, fcfs)
    assert results["lpm"][1] == results["fcfs"][1]  # same greedy answers either way
