"""SLO-aware scheduling decided on a stepped clock: every forward advances a fake clock by
a known step-time function, so the assertions are about the scheduler's decisions."""

from __future__ import annotations

import dataclasses
import logging
import random
from types import SimpleNamespace

import pytest

from radixlm import Engine
from radixlm.errors import SLOUnattainableError
from radixlm.plan.chunk import plan_chunk
from radixlm.runtime.sched.retraction import retraction_order
from radixlm.runtime.sched.slo import SLOController
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool, make_req, run_all, step

PS = 4
A_MS, B_MS, C_MS = 5.0, 0.05, 0.5  # the fake model: t = A + B * prefill + C * decodes


def step_ms(prefill: int, decodes: int) -> float:
    return A_MS + B_MS * prefill + C_MS * decodes


class FakeDeployment:
    """The fake step time in the planner's `Deployment` interface (`radixlm plan chunk`)."""

    def step(self, decode_batch=0, context=0, chunk=0, chunk_prefix=0, chunk_seqs=1):
        return SimpleNamespace(time_s=step_ms(chunk * chunk_seqs, decode_batch) / 1e3)

    def decode(self, batch, context):
        return self.step(decode_batch=batch, context=context)


@pytest.fixture(scope="module")
def engine():
    with Engine(MODEL, max_total_tokens=16384, page_size=PS, chunked_prefill_size=512) as e:
        yield e


class SteppedClock:
    """Seconds that advance only when the scheduler runs a forward."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def setup(engine, *, chunk=512, mixed=False, prior="1,0.01,0.1", **slo):
    """The engine's scheduler, emptied, on a stepped clock whose forwards take `step_ms`;
    with `slo` (ServerArgs SLO fields) an SLOController, else none (fixed `chunk`)."""
    sched = engine.scheduler
    sched.tree.evict(sched.tree.evictable_size())
    clock = SteppedClock()
    run = type(sched.forward_step).run.__get__(sched.forward_step)

    def timed_run(plan, decodes):
        clock.now += step_ms(sum(n for _, n in plan), len(decodes)) / 1e3
        return run(plan, decodes)

    sched.forward_step.run = timed_run
    sched.args = dataclasses.replace(
        sched.args, enable_mixed_chunk=mixed, slo_step_prior=prior, **slo
    )
    sched.clock = clock
    sched.step_prefill_tokens = chunk
    sched.slo = SLOController(sched.args, PS, sched._extend_of) if slo else None
    sched._last_extend = False
    return sched, clock


def add(sched, clock, ids, max_new, **fields):
    req = make_req(ids, max_new, ignore_eos=True)
    req.arrival_time = clock()
    for k, v in fields.items():
        setattr(req, k, v)
    sched.add_request(req)
    return req


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


def start_decoders(sched, clock, n=4, max_new=40):
    """`n` short requests admitted one after another (so the measured steps vary in
    prefill tokens and decode batch: the model's three coefficients are identified)."""
    reqs, outs = [], {}
    for i in range(n):
        reqs.append(add(sched, clock, random_ids(12 + 8 * i, seed=i), max_new))
        for _ in range(2):
            step(sched, outs)
    assert len(sched.running) == n and not sched.waiting
    return reqs, outs


def tpot_ms(req, finish_s: float) -> float:
    return (finish_s - req.first_token_time) * 1e3 / (len(req.output_ids) - 1)


def test_budget_matches_plan_chunk(engine):
    tpot = 30.0
    sched, clock = setup(engine, mixed=True, slo_tpot_ms=tpot)
    decoders, outs = start_decoders(sched, clock, max_new=60)
    prompt = 1200
    add(sched, clock, random_ids(prompt, seed=99), 2)
    budgets = []
    while sched.waiting or sched.chunked:
        step(sched, outs)
        budgets.append(sched.slo.counters.budget_last)
    plan = plan_chunk(
        FakeDeployment(),
        decode_batch=len(decoders),
        context=0,
        prompt=prompt,
        tpot_slo_ms=tpot,
        ttft_slo_ms=1e9,
        align=1,
    )
    assert plan.max_chunk == int((tpot - A_MS - C_MS * len(decoders)) / B_MS)  # 460
    assert all(0 <= plan.max_chunk - b <= PS for b in budgets), (budgets, plan.max_chunk)
    model = sched.slo.model.describe()
    assert model["fixed_ms"] == pytest.approx(A_MS, rel=1e-3)
    assert model["per_prefill_token_ms"] == pytest.approx(B_MS, rel=1e-3)
    assert model["per_decode_request_ms"] == pytest.approx(C_MS, rel=1e-3)
    run_all(sched, outs)
    check_pool(sched, idle=True)


@pytest.mark.parametrize("slo", [False, True], ids=["fixed-512", "slo"])
def test_burst_keeps_decoders_within_tpot(engine, slo):
    tpot = 20.0
    fields = {"slo_tpot_ms": tpot} if slo else {}
    sched, clock = setup(engine, chunk=512, **fields)
    decoders, outs = start_decoders(sched, clock, max_new=30)
    for i in range(3):  # the burst: three long prompts at once
        add(sched, clock, random_ids(900, seed=50 + i), 2)
    stamps: dict = {r.rid: [] for r in decoders}  # clock at each decoder token
    while sched.waiting or sched.running or sched.chunked:
        for o in step(sched, outs):
            if o.rid in stamps and o.new_token_ids:
                stamps[o.rid].append(clock())
    gaps = [(b - a) * 1e3 for t in stamps.values() for a, b in zip(t, t[1:])]
    if slo:  # every token within the target, so every mean (TPOT) too
        assert max(gaps) <= tpot
        assert max(tpot_ms(r, stamps[r.rid][-1]) for r in decoders) <= tpot
        assert sched.slo.counters.tpot_met == sched.slo.counters.finished == 7
    else:  # a 512-token extend step and a decode step (of 4 or more) between two tokens
        assert max(gaps) >= step_ms(512, 0) + step_ms(0, 4) > tpot
    check_pool(sched, idle=True)


def test_priority_orders_admission(engine):
    sched, clock = setup(engine, chunk=8)
    low = add(sched, clock, random_ids(40, seed=1), 2)
    mid = add(sched, clock, random_ids(40, seed=2), 2)
    high = add(sched, clock, random_ids(40, seed=3), 2, priority=5)
    sched.step()  # an 8-token budget: one request starts its first chunk
    assert sched.chunked is high
    assert [r.rid for r in sched.waiting] == [low.rid, mid.rid]
    mid.priority = 1
    first_tokens = []  # rids in the order of their first token
    while sched.waiting or sched.running or sched.chunked:
        for o in sched.step():
            if o.new_token_ids and o.completion_tokens == len(o.new_token_ids):
                first_tokens.append(o.rid)
    assert first_tokens == [high.rid, mid.rid, low.rid]
    check_pool(sched, idle=True)


def test_priority_orders_retraction():
    def r(prio, out, prompt):
        return SimpleNamespace(priority=prio, output_ids=[0] * out, input_ids=[0] * prompt)

    a, b, c, d = r(0, 10, 5), r(0, 2, 5), r(3, 1, 50), r(-1, 90, 5)
    assert retraction_order([a, b, c, d]) == [d, b, a, c]


def test_unmeetable_ttft_is_refused_or_queued(engine, caplog):
    sched, clock = setup(engine, slo_ttft_ms=150.0, slo_admission="reject", prior="5,0.05,0.5")
    first = add(sched, clock, random_ids(2000, seed=7), 2)  # 105 ms predicted: in time
    assert first in sched.waiting
    with pytest.raises(SLOUnattainableError) as info:  # behind it: 205 ms predicted
        add(sched, clock, random_ids(2000, seed=8), 2)
    assert info.value.retry_after_s == pytest.approx((5 + 0.05 * 4000 - 150) / 1e3)
    assert sched.slo.counters.rejected == 1
    sched.slo.reject = False
    with caplog.at_level(logging.WARNING, logger="radixlm.runtime.sched.slo"):
        late = add(sched, clock, random_ids(2000, seed=9), 2)  # queue mode: warned, queued
    assert late in sched.waiting and sched.slo.counters.queued_late == 1
    assert f"request {late.rid}: TTFT target 150 ms cannot be met" in caplog.text
    run_all(sched)
    check_pool(sched, idle=True)
