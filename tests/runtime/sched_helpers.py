"""Helpers for scheduler tests: drive a Scheduler directly and check the pool invariant."""

from __future__ import annotations

import itertools

from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.request import Req, ReqOutput

_rids = itertools.count()


def make_req(ids: list[int], max_new: int = 16, extra_key=None, **params) -> Req:
    """A greedy request with a unique rid."""
    p = SamplingParams(max_new_tokens=max_new, temperature=0, **params)
    return Req(rid=f"t{next(_rids)}", input_ids=list(ids), params=p, extra_key=extra_key)


def step(sched, outs: dict[str, list[ReqOutput]]) -> list[ReqOutput]:
    """One scheduler step; its outputs are also appended to `outs` per rid."""
    got = sched.step()
    for o in got:
        outs.setdefault(o.rid, []).append(o)
    return got


def run_all(sched, outs: dict | None = None, max_steps: int = 100_000) -> dict:
    """Step until idle (then once more to flush abort events); outputs per rid in order."""
    outs = {} if outs is None else outs
    for _ in range(max_steps):
        idle = not (sched.waiting or sched.running or sched.chunked)
        step(sched, outs)
        if idle:
            return outs
    raise AssertionError("scheduler did not go idle")


def tokens(outs: list[ReqOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def check_pool(sched, idle: bool) -> None:
    """free + evictable + protected + pinned + held == total (and, with a second KV tier,
    tier_total == tier_free + tier_used); nothing held or locked (but pins) when idle."""
    mem = sched.memory_accounting()
    parts = ("free", "evictable", "protected", "pinned", "held")
    assert sum(mem[k] for k in parts) == mem["total"], mem
    assert mem["pinned"] == sched.pins.pinned_tokens(), mem
    if "tier_total" in mem:
        assert mem["tier_total"] == mem["tier_free"] + mem["tier_used"], mem
    if idle:
        assert mem["held"] == 0 and mem["protected"] == 0, mem
        assert sched.req_pool.available() == sched.req_pool.size
