"""The speculative draft budgets: acceptance estimates, the measured step-cost curve and
the goodput choice, on hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixlm.config import ServerArgs
from radixlm.runtime.speculative.budget import (
    AcceptanceTracker,
    FixedBudget,
    GoodputBudget,
    StepCostCurve,
    make_budget,
)


class FakeReq:
    """What the budgets read of a request: params.is_greedy and params.seed."""

    def __init__(self, greedy: bool = True, seed: int | None = None):
        self.params = SimpleNamespace(is_greedy=greedy, seed=seed)


def test_acceptance_tracker_counts_geometric_trials():
    t = AcceptanceTracker(prior=0.5, decay=0.9, floor=0.05, prior_trials=2.0)
    a, b = FakeReq(), FakeReq()
    assert t.alpha() == 0.5 and t.alpha(a) == 0.5  # no history: the prior
    t.update_step([(a, 4, 2), (b, 0, 0)])  # a: 2 successes, 1 failure; b: no information
    g = 3.8 / 6.6  # engine-wide: [2, 4] -> [1.8 + 2, 3.6 + 3], once for the step
    assert t.alpha() == pytest.approx(g)
    assert t.alpha(a) == pytest.approx((2 + 2 * g) / (3 + 2))  # own counts + prior of 2
    assert t.alpha(b) == pytest.approx(g)  # nothing of its own yet: the engine's
    t.update_step([(b, 3, 3), (a, 4, 4)])  # all accepted: 3 and 4 successes, no failure
    g2 = (3.8 * 0.9 + 7) / (6.6 * 0.9 + 7)
    assert t.alpha() == pytest.approx(g2)
    assert t.alpha(b) == pytest.approx((3 + 2 * g2) / (3 + 2))
    assert t.alpha(a) == pytest.approx((2 * 0.9 + 4 + 2 * g2) / (3 * 0.9 + 4 + 2))


def test_acceptance_tracker_floor_and_recovery():
    t = AcceptanceTracker(prior=0.5, decay=0.5, floor=0.05, prior_trials=2.0)
    r, other = FakeReq(), FakeReq()
    for _ in range(20):
        t.update_step([(r, 4, 0)])
    assert t.alpha(r) == 0.05 and t.alpha() == 0.05
    for _ in range(20):  # the rest of the engine accepts everything again
        t.update_step([(other, 4, 4)])
    low = t.alpha(r)
    assert low == pytest.approx(0.5, abs=1e-3)  # own 0 of 2 trials against a prior of 2 at 1
    for _ in range(10):  # drafting nothing, its own counts fade: back to the engine's
        t.idle(r)
    assert t.alpha(r) > 0.95 > low
    t.idle(FakeReq())  # unknown requests: nothing to fade


def test_default_prior_keeps_one_rejection_from_silencing_a_request():
    # Three requests accepted all 4 drafts; a fourth had its only draft rejected. The
    # engine's rate: prior 0.9 worth 4 trials, then 12 successes, then 1 failure.
    others, rejected = [FakeReq() for _ in range(3)], FakeReq()

    def tracker(**kw):
        t = AcceptanceTracker(prior=0.9, decay=1.0, **kw)
        t.update_step([(r, 4, 4) for r in others])
        t.update_step([(rejected, 1, 0)])
        return t

    g = 15.6 / 17
    default = tracker()
    assert default.alpha() == pytest.approx(g)
    assert default.alpha(rejected) == pytest.approx(8 * g / 9)  # 0.816
    assert default.alpha(others[0]) == pytest.approx((4 + 8 * g) / 12)  # 0.945
    # 20 ms for 4 rows, +1 ms a row: a draft pays while alpha^k exceeds the step's rate
    # times 1 ms, about 0.47 here. The rejected request keeps 3 drafts (0.816^3 = 0.54);
    # with a prior of 2 trials its estimate falls to 2 g / 3 = 0.61 and it keeps one.
    reqs, caps = [rejected, *others], [4, 4, 4, 4]
    assert GoodputBudget(default, roofline_curve(4)).plan(reqs, caps) == [3, 4, 4, 4]
    weak = tracker(prior_trials=2.0)
    assert weak.alpha(rejected) == pytest.approx(2 * g / 3)
    assert GoodputBudget(weak, roofline_curve(4)).plan(reqs, caps) == [1, 4, 4, 4]


def test_engine_estimate_returns_to_the_prior_while_nothing_drafts():
    # Early rejections at batch 4 make drafts unprofitable; with no verify step the
    # engine-wide estimate would never change again and the engine would never draft.
    # Curve: 20 ms for 4 rows, +1 ms a row, so a first draft pays once alpha > 0.2.
    budget = GoodputBudget(
        AcceptanceTracker(prior=0.5, decay=0.9, floor=0.01), roofline_curve(4, 0.020, 0.001)
    )
    first = [FakeReq() for _ in range(4)]
    for _ in range(10):
        budget.observe_verify([(r, 2, 0) for r in first])
    low = budget.tracker.alpha()
    assert low < 0.05
    reqs = [FakeReq() for _ in range(4)]  # the next turns: no history of their own
    seen = [low]
    for _ in range(40):
        plan = budget.plan(reqs, [4] * 4)
        if any(plan):
            break
        seen.append(budget.tracker.alpha())
    assert any(plan) and 1 < len(seen) < 40
    assert seen == sorted(seen) and 0.2 < budget.tracker.alpha() < 0.5
    before = budget.tracker.alpha()
    assert budget.plan([FakeReq()], [0]) == [0]  # nothing to draft: no decision, no fade
    assert budget.tracker.alpha() == before


def test_step_cost_curve_interpolates_monotone_medians():
    c = StepCostCurve(window=3, prior_rows=32)
    assert not c.has_bucket(1) and c.predict(8) == 0.0
    c.observe(1, 0.010)
    assert c.has_bucket(1) and not c.has_bucket(2)
    assert c.predict(1) == 0.010
    assert c.predict(0) == 0.010  # below the first point: its time
    assert c.predict(43) == pytest.approx(0.010 + 0.010 / 33 * 42)  # one point: prior slope
    for t in (0.020, 0.021, 0.500):  # a preempted step does not move the median
        c.observe(16, t)
    c.observe(32, 0.036)
    assert c.points() == [(1, 0.010), (16, 0.021), (32, 0.036)]
    assert c.predict(8) == pytest.approx(0.010 + 0.011 * 7 / 15)
    assert c.predict(48) == pytest.approx(0.036 + 0.015 / 16 * 16)  # last segment's slope
    c.observe(64, 0.030)  # noise below an earlier point: kept non-decreasing
    assert c.points()[-1] == (64, 0.036)
    for bad in (float("nan"), float("inf"), -1.0):
        c.observe(8, bad)
    c.observe(0, 1.0)
    assert [p[0] for p in c.points()] == [1, 16, 32, 64]
    with pytest.raises(ValueError, match="window"):
        StepCostCurve(window=0)


def test_step_cost_curve_buckets_and_window():
    assert [StepCostCurve.bucket(r) for r in (1, 2, 3, 4, 6, 8, 16)] == [0, 2, 3, 4, 5, 6, 8]
    c = StepCostCurve(window=2)
    for t in (1.0, 0.2, 0.4):  # only the last two points count
        c.observe(16, t)
    assert c.points() == [(16, pytest.approx(0.3))]


def roofline_curve(floor_rows: int = 20, floor_s: float = 0.020, per_row_s: float = 0.001):
    """A step cost flat up to `floor_rows` rows, then per_row_s per extra row."""
    c = StepCostCurve(window=1)
    for r in (1, 2, 4, 8, 16, 20, 32, 64, 128):
        c.observe(r, floor_s + per_row_s * max(0, r - floor_rows))
    return c


def test_goodput_takes_the_best_prefix():
    tracker = AcceptanceTracker(floor=0.01)
    budget = GoodputBudget(tracker, roofline_curve())
    one = [FakeReq()]
    assert budget.plan(one, [4]) == [4]  # 5 rows are free at batch 1: every draft pays
    assert budget.plan(one, [0]) == [0]
    # batch 16, alpha 0.5: 4 rows are free (1st drafts of 4 requests), then each row costs
    # 1 ms against a 20 ms step of 16 + accepted tokens: 0.5 / 1 ms > 16 / 20 ms is false
    reqs = [FakeReq() for _ in range(16)]
    assert sum(budget.plan(reqs, [4] * 16)) == 4
    # alpha 0.95 at batch 16: the 4 free rows make 19.8 tokens per 20 ms, and a paid row
    # adds 0.95 tokens per ms, less than that rate; the ranking spreads depth-1 drafts
    good = AcceptanceTracker(prior=0.95, floor=0.01)
    plan = GoodputBudget(good, roofline_curve()).plan(reqs, [4] * 16)
    assert sorted(plan) == [0] * 12 + [1] * 4
    expected = [
        (16 + sum(0.95 ** (1 + j // 16) for j in range(n))) / roofline_curve().predict(16 + n)
        for n in range(65)
    ]
    assert sum(plan) == max(range(65), key=expected.__getitem__)


def test_goodput_measures_a_plain_step_first_and_keeps_seeded_caps():
    budget = GoodputBudget(AcceptanceTracker(prior=0.01, floor=0.01))
    reqs = [FakeReq() for _ in range(16)]
    assert budget.plan(reqs, [3] * 16) == [0] * 16  # no step of 16 rows measured: plain
    budget.observe_step(16, 0.020)
    budget.observe_step(80, 0.080)
    seeded = FakeReq(greedy=False, seed=7)
    plan = budget.plan([*reqs, seeded], [3] * 17)
    assert plan == [0] * 16 + [3]  # the seeded request's tree may not follow timing


def test_goodput_prices_smaller_batches_off_the_curve_and_measures_larger_ones():
    # Steps of 4 and 8 rows measured (20 and 24 ms). A batch of 2 is priced off the
    # curve (t(2) = t(4) = 20 ms, its first point): at alpha 0.9 every draft pays, so the
    # batch drafts at once instead of first running a plain step of 2. A batch of 12
    # would extrapolate t(12): it runs a plain step first, then drafts.
    budget = GoodputBudget(AcceptanceTracker(prior=0.9, decay=1.0))
    budget.observe_step(4, 0.020)
    budget.observe_step(8, 0.024)
    assert budget.cost.covers(2) and budget.cost.covers(8) and not budget.cost.covers(12)
    assert budget.plan([FakeReq(), FakeReq()], [4, 4]) == [4, 4]
    twelve = [FakeReq() for _ in range(12)]
    assert budget.plan(twelve, [1] * 12) == [0] * 12
    budget.observe_step(12, 0.028)
    assert budget.plan(twelve, [1] * 12) == [1] * 12


def test_goodput_learns_from_verified_drafts():
    budget = GoodputBudget(AcceptanceTracker(prior=0.5, decay=1.0), roofline_curve())
    good, bad = FakeReq(), FakeReq()
    for _ in range(10):
        budget.observe_verify([(good, 4, 4), (bad, 4, 0)])
    g = 42 / 54  # the prior's 2 of 4 trials, then 40 successes in 50 trials
    assert budget.tracker.alpha() == pytest.approx(g)
    assert budget.tracker.alpha(good) == pytest.approx((40 + 8 * g) / 48)  # 0.96
    assert budget.tracker.alpha(bad) == pytest.approx(8 * g / 18)  # 0.35: 10 trials against 8
    reqs = [good] * 8 + [bad] * 8  # the tracker keys by object: same estimates
    plan = budget.plan(reqs, [4] * 16)
    assert sum(plan[:8]) > 0 and sum(plan[8:]) == 0
    assert "spec_accept_alpha" in budget.stats()


def test_fixed_budget_and_errors():
    assert FixedBudget().plan([FakeReq(), FakeReq()], [2, 0]) == [2, 0]
    assert isinstance(make_budget("goodput"), GoodputBudget)
    with pytest.raises(ValueError, match="unknown speculative budget"):
        make_budget("greedy")
    with pytest.raises(ValueError, match="speculative_budget must be one of"):
        ServerArgs(speculative_budget="greedy")
