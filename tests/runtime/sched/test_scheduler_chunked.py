"""Chunked prefill: exact at every chunk boundary, and decodes keep flowing between chunks."""

from __future__ import annotations

import dataclasses

import pytest

from radixlm import Engine
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool, make_req, run_all, step, tokens

NEW = 8
PS = 4


@pytest.fixture(scope="module")
def engine():
    with Engine(MODEL, max_total_tokens=4096, page_size=PS, chunked_prefill_size=64) as e:
        yield e


def _fresh(engine, chunk: int):
    """The engine's scheduler with an empty cache and `chunk` prefill tokens per step."""
    sched = engine.scheduler
    sched.tree.evict(sched.tree.evictable_size())
    sched.step_prefill_tokens = chunk
    return sched


def _generate(sched, ids: list[int], max_new: int = NEW):
    req = make_req(ids, max_new)
    sched.add_request(req)
    outs = run_all(sched)[req.rid]
    check_pool(sched, idle=True)
    return tokens(outs), outs[-1]


@pytest.mark.parametrize("delta", [0, -1, 1], ids=["exact", "one-over", "one-under"])
def test_prompt_vs_chunk_boundary(engine, prompts, reference, delta):
    ids = prompts[7]  # 38 tokens
    sched = _fresh(engine, len(ids) + delta)  # delta -1: a second chunk of one token
    steps_before = sched.counters.extend_steps
    out, last = _generate(sched, ids)
    assert out == reference[7][:NEW]
    assert last.cached_tokens == 0
    assert sched.counters.extend_steps - steps_before == (2 if delta < 0 else 1)


@pytest.mark.parametrize("chunk", [1, 2, 64])
def test_cache_hit_leaves_few_tokens(engine, prompts, reference, chunk):
    ids = prompts[6]  # 36 tokens
    sched = _fresh(engine, 64)
    _generate(sched, ids[:-5], max_new=1)  # caches (len - 5) page-aligned tokens
    sched.step_prefill_tokens = chunk
    out, last = _generate(sched, ids)
    assert out == reference[6][:NEW]
    assert last.cached_tokens == (len(ids) - 5) // PS * PS


def test_cache_hit_covers_whole_prompt(engine, prompts, reference):
    ids = prompts[6]
    sched = _fresh(engine, 64)
    _generate(sched, ids)
    before = sched.counters.prefill_tokens
    out, last = _generate(sched, ids)  # the last token still runs to produce logits
    assert out == reference[6][:NEW]
    assert last.cached_tokens == (len(ids) - 1) // PS * PS
    assert sched.counters.prefill_tokens - before == len(ids) - last.cached_tokens


def test_long_prompt_does_not_freeze_streams(engine, prompts, reference):
    chunk = 64
    sched = _fresh(engine, chunk)
    streams = [make_req(prompts[i], 60, ignore_eos=True) for i in range(4)]
    for r in streams:
        sched.add_request(r)
    while len(sched.running) < 4:
        sched.step()
    long_req = make_req(prompts[5], 4)  # ~1,500 tokens: 24 chunks
    sched.add_request(long_req)
    # Per step: the prefill tokens it computed and which streams got a token.
    gaps = {r.rid: 0 for r in streams}  # prefill tokens since the stream's last token
    worst, steps_since = 0, {r.rid: 0 for r in streams}
    worst_steps, long_out = 0, []
    while long_req.finish_reason is None:
        before = sched.counters.prefill_tokens
        outs = sched.step()
        computed = sched.counters.prefill_tokens - before
        got = {o.rid for o in outs if o.new_token_ids}
        for rid in gaps:
            gaps[rid] += computed
            steps_since[rid] += 1
            if rid in got:
                worst = max(worst, gaps[rid])
                worst_steps = max(worst_steps, steps_since[rid])
                gaps[rid] = steps_since[rid] = 0
        long_out += [t for o in outs if o.rid == long_req.rid for t in o.new_token_ids]
        assert all(r.finish_reason is None for r in streams), "streams must outlive the prompt"
    # Between two tokens of any stream at most one chunk was prefilled (one extend step
    # and one decode step), although the prompt needed ~24 chunks.
    assert worst <= chunk and worst_steps <= 2
    assert sched.counters.extend_steps >= len(prompts[5]) // chunk
    assert long_out == reference[5][: len(long_out)]
    for r in streams:
        sched.abort(r.rid)
    run_all(sched)
    check_pool(sched, idle=True)


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "unmixed"])
def test_new_turn_beside_decodes(engine, prompts, reference, mixed):
    # A request arriving while another decodes (a session's next turn beside the others'
    # answers): with mixed chunks its extend step also yields the running request's token
    # (no decode step of its own); without, a decode step follows the extend step.
    sched = _fresh(engine, 64)
    args = sched.args
    sched.args = dataclasses.replace(args, enable_mixed_chunk=mixed)
    try:
        running = make_req(prompts[0], NEW)
        sched.add_request(running)
        outs: dict = {}
        while len(tokens(outs.get(running.rid, []))) < 2:
            step(sched, outs)
        turn = make_req(prompts[7], NEW)
        sched.add_request(turn)
        c = sched.counters
        before = (c.extend_steps, c.decode_steps)
        got = {o.rid for o in step(sched, outs) if o.new_token_ids}
        assert (c.extend_steps, c.decode_steps) == (before[0] + 1, before[1])
        assert got == ({running.rid, turn.rid} if mixed else {turn.rid})
        run_all(sched, outs)
        assert tokens(outs[running.rid]) == reference[0][:NEW]
        assert tokens(outs[turn.rid]) == reference[7][:NEW]
        check_pool(sched, idle=True)
    finally:
        sched.args = args


def test_cache_salt_namespaces(engine, prompts, reference):
    ids = prompts[7]
    sched = _fresh(engine, 16)
    hit = (len(ids) - 1) // PS * PS
    cached = []
    for salt in ("alice", "bob", "alice", None):
        req = make_req(ids, NEW, extra_key=salt)
        sched.add_request(req)
        outs = run_all(sched)[req.rid]
        assert tokens(outs) == reference[7][:NEW]
        cached.append(outs[-1].cached_tokens)
    assert cached == [0, 0, hit, 0]  # shared only within one namespace
    check_pool(sched, idle=True)
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1}, cache_salt="bob")
    assert out["usage"]["cached_tokens"] == hit
