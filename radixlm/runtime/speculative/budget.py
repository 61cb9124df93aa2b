"""How many draft tokens each request may verify in a speculative step.

`FixedBudget` gives every request the cap (--speculative-num-draft-tokens, bounded by its
remaining tokens, the context and the KV pool). `GoodputBudget` (the default,
--speculative-budget goodput) gives each request only the drafts that raise the step's
expected tokens per second, after SmartSpec (Liu et al. 2024, "Optimizing Speculative
Decoding for Serving Large Language Models Using Goodput"):

* Acceptance. Each request keeps alpha, the estimated probability that a draft token is
  accepted given that its parent was (the geometric model of Leviathan et al. 2023): a
  verified chain of depth n with m accepted drafts is m successes and, when m < n, one
  failure (`AcceptanceTracker`: exponentially weighted, with the whole engine's estimate
  as a prior; a request's own counts fade while it drafts nothing, and the engine's fade
  back to the starting prior while no request drafts, so drafting always resumes: an
  early run of rejections, e.g. at the start of every answer, cannot silence the
  engine for good).
* Cost. The step time t(R) is measured online as a curve over the rows R a step verified
  (requests + draft tokens; plain decode steps are R = B): `StepCostCurve`. A batch of B
  requests runs one plain step first where the curve would extrapolate t(B) (no step of
  B rows or more measured yet), so drafts are never priced against a guessed t(B); a
  batch smaller than a measured step is priced off the curve (below its first point,
  that point's time: an overestimate, which favours drafts only where a batch is small
  and its extra rows are nearly free). A batch shrinking as its requests finish thus
  keeps drafting instead of spending a plain step on each new size.
* Choice. With B requests and no drafts the step emits E = B tokens (one bonus each) in
  t(B). The k-th draft of request i adds alpha_i^k expected tokens and one row. Drafts
  are ranked by alpha_i^k (each request's gains fall with depth, so every prefix of the
  ranking is a valid set of chains) and the prefix with the most expected tokens per
  second, E(R) / t(R), is taken.

A sampled request with its own seed keeps its cap: rejection sampling's draws follow the
tree, so a timing-dependent tree would break "same seed, same output" (greedy output is
the same for every budget). Clients that send a seed with every sampled request get the
fixed budget for those requests.

What this buys depends on the measured curve: where a step is memory-bound (small
batches) extra rows are nearly free and drafts pay even at modest acceptance; where it
is compute-bound each extra row costs its full compute and only well-accepted drafts pay
(docs/speculative.md). Approximations:
tree drafts (--speculative-topk > 1) are priced by node as if each were the next link
of a chain, and a drafter with its own forward (a draft model, EAGLE) costs per draft
level rather than per row; the measured t includes that cost only as far as it shows
in rows.
"""

from __future__ import annotations

import abc
import collections
import math
import statistics
import weakref

from radixlm.runtime.sched.request import Req

_LOG_STEP = math.log(1.4)  # StepCostCurve's buckets are 1.4x apart


class DraftBudget(abc.ABC):
    """Chooses per-request draft counts and learns from each step's outcome."""

    #: Whether the caps `plan` gets are cut to what the drafter has for each request
    #: (`Drafter.available`), so that rows a request cannot fill go to the others.
    within_available: bool = True

    @abc.abstractmethod
    def plan(self, reqs: list[Req], caps: list[int]) -> list[int]:
        """Draft tokens per request, each in [0, caps[i]]."""

    def observe_step(self, rows: int, seconds: float) -> None:  # noqa: B027 - optional
        """A decode or verify step over `rows` tokens took `seconds` (default: ignored)."""

    def observe_verify(self, verified: list[tuple[Req, int, int]]) -> None:  # noqa: B027
        """A verify step: (request, draft depth, accepted drafts) per request that drafted."""

    def stats(self) -> dict[str, float]:
        """Counters for `Scheduler.stats()` (default: none)."""
        return {}


class FixedBudget(DraftBudget):
    """Every request drafts its cap, whatever the drafter has for it: every step where a
    request may draft verifies, an empty tree included (for tests and measurements)."""

    within_available = False

    def plan(self, reqs: list[Req], caps: list[int]) -> list[int]:
        return list(caps)


class AcceptanceTracker:
    """Per-request and engine-wide estimates of alpha (see the module docstring).

    A request's estimate is (s + w a_g) / (n + w): its own successes s and trials n, both
    exponentially weighted, plus the engine-wide estimate a_g as a prior worth w =
    `prior_trials` trials. A verify step adds about one trial per request, so a weak prior
    lets one rejection drive a request's estimate far below its real rate, and the short
    drafts it then gets rebuild the estimate only slowly; w = 8 moves a request off the
    engine's rate only on a run of its own evidence (docs/speculative.md, "Draft budget",
    has the calibration). A request's own counts also fade while it drafts nothing
    (`idle`), so an early run of rejections does not silence it for good: its estimate
    drifts back to the engine's and it drafts again where that pays. Likewise the
    engine-wide counts fade back to the starting prior over steps where no request
    drafts (`idle_step`): without a verify step nothing would update them.

    Args:
        prior: the engine-wide alpha before anything was verified.
        decay: weight kept by older trials per verify of that request, per idle step of
            that request, and (engine-wide) per verify step.
        floor: lowest alpha reported.
        prior_trials: w above.
    """

    def __init__(
        self, prior: float = 0.5, decay: float = 0.9, floor: float = 0.05, prior_trials: float = 8.0
    ):
        self.decay, self.floor, self.prior_trials = decay, floor, prior_trials
        self._start = (prior * 4.0, 4.0)  # successes, trials: a prior worth 4 trials
        self._global = list(self._start)
        self._per_req: weakref.WeakKeyDictionary[Req, list[float]] = weakref.WeakKeyDictionary()

    def alpha(self, req: Req | None = None) -> float:
        """Estimated acceptance of `req` (None: the engine-wide estimate), >= floor."""
        gs, gn = self._global
        est = gs / gn if gn > 0 else 0.0
        if req is not None and req in self._per_req:
            s, n = self._per_req[req]
            est = (s + self.prior_trials * est) / (n + self.prior_trials)
        return max(self.floor, min(1.0, est))

    def update_step(self, verified: list[tuple[Req, int, int]]) -> None:
        """Record one verify step: (request, depth, accepted) per request that drafted
        (0 <= accepted <= depth; depth 0 carries no information and is skipped). A chain
        of depth n with m accepted is m successes and, when m < n, one failure."""
        succ = trials = 0.0
        for req, depth, accepted in verified:
            if depth <= 0:
                continue
            t = accepted + (1 if accepted < depth else 0)
            own = self._per_req.setdefault(req, [0.0, 0.0])
            own[0] = own[0] * self.decay + accepted
            own[1] = own[1] * self.decay + t
            succ, trials = succ + accepted, trials + t
        if trials:
            g = self._global
            g[0] = g[0] * self.decay + succ
            g[1] = g[1] * self.decay + trials

    def idle_step(self) -> None:
        """No request drafted this step: the engine-wide counts move a `decay` step back
        toward the starting prior."""
        g, d = self._global, self.decay
        g[0] = g[0] * d + (1.0 - d) * self._start[0]
        g[1] = g[1] * d + (1.0 - d) * self._start[1]

    def idle(self, req: Req) -> None:
        """`req` drafted nothing this step: its own counts fade by `decay`."""
        own = self._per_req.get(req)
        if own is not None:
            own[0] *= self.decay
            own[1] *= self.decay


class StepCostCurve:
    """Measured step time as a function of the rows R a step computes (seconds).

    Steps are binned by R into buckets about 1.4x apart (1, 2, 3, 4, 6, 8, 11, 16, ...);
    each bucket keeps its last `window` (R, seconds) points and is represented by their
    medians (robust to a step preempted on a shared machine). t(R) interpolates linearly
    between the represented points in R order, kept non-decreasing; below the first
    point it is that point's time, above the last it continues the last segment's slope
    (with one point only, the prior slope t / (R + `prior_rows`)). No straight line fits
    this curve: on a CPU the first extra rows of a small batch are nearly free (weights
    stream from memory anyway) and each row costs its full compute past the knee.

    Args:
        window: points kept per bucket.
        prior_rows: with a single point, the rows that would double its time.
    """

    def __init__(self, window: int = 8, prior_rows: float = 32.0):
        if window < 1 or prior_rows <= 0:
            raise ValueError("StepCostCurve needs window >= 1 and prior_rows > 0")
        self.window, self.prior_rows = window, prior_rows
        self._buckets: dict[int, collections.deque] = {}
        self._points: list[tuple[float, float]] | None = []

    @staticmethod
    def bucket(rows: int) -> int:
        """Bucket index of `rows` (>= 1): round(log(rows) / log(1.4))."""
        return round(math.log(rows) / _LOG_STEP)

    def has_bucket(self, rows: int) -> bool:
        """Whether a step of about `rows` rows (the same bucket) was observed."""
        return self.bucket(max(rows, 1)) in self._buckets

    def covers(self, rows: int) -> bool:
        """Whether `predict(rows)` reads measured points rather than extrapolating: a
        step of about `rows` rows (`has_bucket`) or of more rows was observed."""
        pts = self.points()  # in R order
        return self.has_bucket(rows) or bool(pts) and pts[-1][0] >= rows

    def observe(self, rows: int, seconds: float) -> None:
        """Add one step: `rows` tokens in `seconds` (non-finite or negative ignored)."""
        if rows <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        b = self._buckets.setdefault(self.bucket(rows), collections.deque(maxlen=self.window))
        b.append((rows, seconds))
        self._points = None

    def points(self) -> list[tuple[float, float]]:
        """(rows, seconds) per observed bucket in R order, seconds non-decreasing."""
        if self._points is None:
            pts = []
            for key in sorted(self._buckets):
                b = self._buckets[key]
                r = statistics.median(p[0] for p in b)
                t = statistics.median(p[1] for p in b)
                pts.append((r, max(t, pts[-1][1]) if pts else t))
            self._points = pts
        return self._points

    def predict(self, rows: int) -> float:
        """Predicted seconds of a step of `rows` rows (0.0 before any observation)."""
        pts = self.points()
        if not pts:
            return 0.0
        if rows <= pts[0][0]:
            return pts[0][1]
        for (r0, t0), (r1, t1) in zip(pts, pts[1:]):
            if rows <= r1:
                return t0 + (t1 - t0) * (rows - r0) / (r1 - r0)
        r1, t1 = pts[-1]
        if len(pts) == 1:
            slope = t1 / (r1 + self.prior_rows)
        else:
            r0, t0 = pts[-2]
            slope = (t1 - t0) / (r1 - r0)
        return t1 + slope * (rows - r1)


class GoodputBudget(DraftBudget):
    """Drafts that raise expected tokens per second (see the module docstring).

    Args:
        tracker, cost: the acceptance and step-cost estimators (defaults as documented
            on their classes).
    """

    def __init__(self, tracker: AcceptanceTracker | None = None, cost: StepCostCurve | None = None):
        self.tracker = tracker or AcceptanceTracker()
        self.cost = cost or StepCostCurve()

    def plan(self, reqs: list[Req], caps: list[int]) -> list[int]:
        budgets = [0] * len(reqs)
        if not self.cost.covers(len(reqs)):  # t(B) would be extrapolated: measure it
            return budgets  # with a plain step first
        rows, gain = len(reqs), float(len(reqs))
        candidates = []
        for i, (req, cap) in enumerate(zip(reqs, caps)):
            alpha = self.tracker.alpha(req)
            if not req.params.is_greedy and req.params.seed is not None:
                budgets[i] = cap  # reproducible draws need a tree independent of timing
                gain += sum(alpha**k for k in range(1, cap + 1))
                rows += cap
                continue
            candidates.extend((alpha**k, k, i) for k in range(1, cap + 1))
        candidates.sort(key=lambda c: (-c[0], c[1]))
        best, best_rate = 0, gain / max(self.cost.predict(rows), 1e-9)
        for n, (g, _, _) in enumerate(candidates, start=1):
            gain += g
            rate = gain / max(self.cost.predict(rows + n), 1e-9)
            if rate > best_rate:
                best, best_rate = n, rate
        for _, _, i in candidates[:best]:
            budgets[i] += 1
        if candidates and not any(budgets):
            self.tracker.idle_step()
        for req, n in zip(reqs, budgets):
            if n == 0:
                self.tracker.idle(req)
        return budgets

    def observe_step(self, rows: int, seconds: float) -> None:
        self.cost.observe(rows, seconds)

    def observe_verify(self, verified: list[tuple[Req, int, int]]) -> None:
        self.tracker.update_step(verified)

    def stats(self) -> dict[str, float]:
        return {"spec_accept_alpha": self.tracker.alpha()}


BUDGETS = {"fixed": FixedBudget, "goodput": GoodputBudget}


def make_budget(name: str) -> DraftBudget:
    """The budget named by --speculative-budget. Raises ValueError if unknown."""
    if name not in BUDGETS:
        raise ValueError(f"unknown speculative budget {name!r} (choose from {sorted(BUDGETS)})")
    return BUDGETS[name]()
