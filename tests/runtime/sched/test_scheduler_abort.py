"""Abort in every state, admission limits, and rejections; the pool invariant holds."""

from __future__ import annotations

import dataclasses

import pytest

from radixlm import Engine
from radixlm.errors import InvalidRequestError, QueueFullError, RequestTooLargeError
from radixlm.runtime.sched.scheduler import Scheduler
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool, make_req, run_all, step, tokens

NEW = 8
MAX_RUNNING = 3


@pytest.fixture(scope="module")
def engine():
    with Engine(
        MODEL, max_total_tokens=1024, page_size=4, chunked_prefill_size=8,
        max_running_requests=MAX_RUNNING,
    ) as e:  # fmt: skip
        yield e


@pytest.fixture
def sched(engine):
    s = engine.scheduler
    s.tree.evict(s.tree.evictable_size())
    yield s
    run_all(s)
    check_pool(s, idle=True)


def _aborted(outs, rid) -> bool:
    return outs[rid][-1].finish_reason == "abort"


def test_abort_waiting(sched, prompts):
    a, b = make_req(prompts[0], NEW), make_req(prompts[1], NEW)
    sched.add_request(a)
    sched.add_request(b)
    assert sched.abort(b.rid) and not sched.abort(b.rid)
    check_pool(sched, idle=True)
    outs = run_all(sched)
    assert _aborted(outs, b.rid) and outs[b.rid][-1].new_token_ids == []
    assert outs[a.rid][-1].finish_reason in ("stop", "length")


def test_abort_mid_chunk(sched, prompts, reference):
    victim, other = make_req(prompts[6], NEW), make_req(prompts[7], NEW)
    sched.add_request(victim)
    outs: dict = {}
    step(sched, outs)
    assert sched.chunked is victim  # 36 tokens in 8-token chunks
    check_pool(sched, idle=False)
    assert sched.abort(victim.rid)
    assert sched.chunked is None
    check_pool(sched, idle=True)
    sched.add_request(other)
    run_all(sched, outs)
    assert _aborted(outs, victim.rid)
    assert tokens(outs[other.rid]) == reference[7][:NEW]


def test_abort_decoding(sched, prompts, reference):
    victim, other = make_req(prompts[2], 30, ignore_eos=True), make_req(prompts[0], NEW)
    sched.add_request(victim)
    sched.add_request(other)
    outs: dict = {}
    while victim not in sched.running:
        step(sched, outs)
    step(sched, outs)
    assert sched.abort(victim.rid)
    check_pool(sched, idle=False)
    run_all(sched, outs)
    assert _aborted(outs, victim.rid)
    assert tokens(outs[other.rid]) == reference[0][:NEW]


def test_abort_one_of_n_siblings(sched, prompts, reference):
    sibs = [make_req(prompts[6], NEW) for _ in range(3)]
    for r in sibs:
        sched.add_request(r)
    outs: dict = {}
    for _ in range(6):  # siblings at different stages (chunking, deferred, decoding)
        step(sched, outs)
    assert sched.abort(sibs[1].rid)
    check_pool(sched, idle=False)
    run_all(sched, outs)
    assert _aborted(outs, sibs[1].rid)
    for r in (sibs[0], sibs[2]):
        assert tokens(outs[r.rid]) == reference[6][:NEW]
    # The shared prompt was prefilled once; later siblings hit it.
    assert outs[sibs[2].rid][-1].cached_tokens == (len(prompts[6]) - 1) // 4 * 4


def test_max_running_requests(sched, prompts):
    reqs = [make_req(prompts[i], 4) for i in (0, 1, 2, 3, 4)]
    for r in reqs:
        sched.add_request(r)
    while sched.waiting or sched.running or sched.chunked:
        sched.step()
        holders = len(sched.running) + (sched.chunked is not None)
        assert holders <= MAX_RUNNING
        check_pool(sched, idle=False)


def test_queue_full_is_immediate(engine, sched, prompts):  # sched: main cache emptied
    # Capacity = max_queued_requests + free running rows: 2 + 1 while nothing runs.
    args = dataclasses.replace(engine.args, max_queued_requests=2, max_running_requests=1)
    sched = Scheduler(args, engine.runner, [2])  # shares the pools with the idle main one
    for p in prompts[:3]:
        sched.add_request(make_req(p, 2))
    with pytest.raises(QueueFullError, match="queue is full"):
        sched.add_request(make_req(prompts[3], 2))
    assert len(sched.waiting) == 3 and sched.stats()["num_rejected_total"] == 1
    run_all(sched)
    sched.tree.evict(sched.tree.evictable_size())
    check_pool(sched, idle=True)


def test_too_large_rejected_at_admission(engine, sched, prompts):
    huge = make_req(prompts[0], 1024)  # prompt + max_new_tokens > 1,024 KV slots
    with pytest.raises(RequestTooLargeError, match="cannot fit"):
        sched.add_request(huge)
    assert not sched.waiting
    with pytest.raises(InvalidRequestError, match="cannot fit"):
        engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 1024})


def test_engine_surfaces_queue_full_and_queues_nothing(engine, sched, prompts):
    sched.args = dataclasses.replace(engine.args, max_queued_requests=2, max_running_requests=1)
    try:
        with pytest.raises(QueueFullError):
            engine.generate(input_ids=prompts[:4])  # capacity 2 + 1 free row
        assert not sched.waiting and not engine._tracked  # all or nothing
    finally:
        sched.args = engine.args


def test_flush_cache_after_an_aborted_stream(engine, sched, prompts):
    params = {"max_new_tokens": 20, "ignore_eos": True, "temperature": 0}
    stream = engine.generate(input_ids=prompts[0], sampling_params=params, stream=True)
    next(stream)
    stream.close()  # aborts; its abort event is still pending in the scheduler
    assert engine.flush_cache()
    mem = engine.get_server_info()["memory"]
    assert mem["free"] == mem["total"] and mem["evictable"] == 0
