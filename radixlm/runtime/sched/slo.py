"""SLO-aware scheduling: each step's prefill budget, the admission order, admission
control and goodput counters, from TTFT / TPOT targets (`--slo-ttft-ms`, `--slo-tpot-ms`,
per-request overrides) and the online step-time model (`step_model.py`).

Budget (Agrawal et al. 2024, Sarathi-Serve: a decoding request gets one token per step, so
its inter-token latency is the step time). A running request r with TPOT target T_r that
has produced n_r tokens, the first `e_r` ms ago, keeps its mean TPOT <= T_r after its next
token iff that token arrives within  T_r * n_r - e_r  ms; the allowance is that, capped at
T_r (slack is not banked, so no single step stalls a stream longer than its target). The
step's prefill budget is the largest chunk C whose predicted step fits the tightest
allowance: t(C, B) <= allowance with mixed chunks (the B decodes ride in the step), else
t(C, 0) + t(0, B + 1) <= allowance (a decode step follows every extend step, and the
prompt the extend step completes decodes in it too). C is rounded down
to whole pages, at least one page so prefill always progresses, at most
--max-prefill-tokens; with no running request that has a TPOT target, C is that maximum.

Admission order: strict priority (higher first), then within one priority the set of
requests that can meet their TTFT targets is made as large as possible by Moore and
Hodgson's algorithm (Moore 1968, "An n job, one machine sequencing algorithm for minimizing
the number of late jobs": earliest deadline first, dropping the longest job whenever one
would be late; optimal for one machine). A request's work is its uncached prompt tokens
times the predicted time per prefill token at this budget, its deadline its arrival plus
its TTFT target. The on-time set keeps the configured policy's order (cache-aware lpm,
...) when that order meets all its deadlines, else runs in deadline order; the requests
that will be late follow in policy order.

Admission control: at arrival, a request whose predicted TTFT (the uncached prompt tokens
of the waiting requests of its priority or higher, plus its own) exceeds its target is
refused (`--slo-admission reject`: `SLOUnattainableError`, HTTP 429 with Retry-After) or
queued with a warning (`queue`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixlm.config import ServerArgs, parse_step_prior
from radixlm.errors import SLOUnattainableError
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.step_model import StepTimeModel

logger = logging.getLogger(__name__)


@dataclass
class SLOCounters:
    """Totals since start: finished requests with a target and how many met each, requests
    refused or queued late at arrival, and the prefill budgets chosen (tokens)."""

    finished: int = 0
    ttft_met: int = 0
    tpot_met: int = 0
    both_met: int = 0
    rejected: int = 0
    queued_late: int = 0
    budget_last: int = 0
    budget_sum: int = 0
    budget_steps: int = 0


class SLOController:
    """The SLO policy of one scheduler (module doc).

    Args:
        args: --slo-ttft-ms / --slo-tpot-ms (the server's targets, ms), --slo-admission,
            --slo-step-prior, --enable-mixed-chunk (default on), --max-prefill-tokens.
        page_size: tokens per KV page (budgets are whole pages).
        extend_of: uncached prompt tokens a waiting request would compute (cache match).
    """

    def __init__(self, args: ServerArgs, page_size: int, extend_of: Callable[[Req], int]):
        self.ttft_ms = args.slo_ttft_ms
        self.tpot_ms = args.slo_tpot_ms
        self.reject = args.slo_admission == "reject"
        self.mixed = args.enable_mixed_chunk
        self.cap = max(args.max_prefill_tokens // page_size * page_size, page_size)
        self.page_size = page_size
        self.extend_of = extend_of
        self.model = StepTimeModel(parse_step_prior(args.slo_step_prior))
        self.counters = SLOCounters()

    @staticmethod
    def enabled(args: ServerArgs) -> bool:
        """Whether the server runs SLO-aware scheduling (either target set)."""
        return args.slo_ttft_ms is not None or args.slo_tpot_ms is not None

    def targets(self, req: Req) -> tuple[float | None, float | None]:
        """The request's (TTFT, TPOT) targets in ms: its overrides, else the server's."""
        ttft = req.slo_ttft_ms if req.slo_ttft_ms is not None else self.ttft_ms
        tpot = req.slo_tpot_ms if req.slo_tpot_ms is not None else self.tpot_ms
        return ttft, tpot

    # ---- the step's prefill budget ---------------------------------------------------

    def allowance_ms(self, running: Sequence[Req], now: float) -> float | None:
        """The tightest running request's time to its next token (ms), or None when no
        running request with a first token has a TPOT target."""
        tightest = None
        for r in running:
            tpot = self.targets(r)[1]
            if tpot is None or r.first_token_time < 0:
                continue
            n = len(r.output_ids)
            left = min(tpot, tpot * n - (now - r.first_token_time) * 1e3)
            tightest = left if tightest is None else min(tightest, left)
        return tightest

    def step_ms(self, budget: int, decode_batch: int) -> float:
        """Predicted time between two tokens of a decoding request when each extend step
        computes `budget` prefill tokens next to `decode_batch` decodes."""
        m = self.model
        if self.mixed or decode_batch == 0:
            return m.predict_ms(budget, decode_batch)
        return m.predict_ms(budget, 0) + m.predict_ms(0, decode_batch)

    def budget(self, running: Sequence[Req], now: float) -> int:
        """The prefill token budget for a step now (module doc)."""
        allowance = self.allowance_ms(running, now)
        if allowance is None or not self.model.ready:
            return self.cap
        b = len(running)
        if self.mixed:
            fit = self.model.largest_prefill(allowance, b, self.cap)
        else:
            # The decode step after this extend step also runs the prompt it completes.
            after = allowance - self.model.predict_ms(0, b + 1)
            fit = self.model.largest_prefill(after, 0, self.cap)
        return max(fit // self.page_size * self.page_size, self.page_size)

    def choose_budget(self, running: Sequence[Req], now: float) -> int:
        """`budget` for this step, recorded in the counters."""
        budget = self.budget(running, now)
        c = self.counters
        c.budget_last = budget
        c.budget_sum += budget
        c.budget_steps += 1
        return budget

    # ---- admission order -------------------------------------------------------------

    def order(
        self, waiting: Sequence[Req], now: float, budget: int, decode_batch: int, ahead: int
    ) -> list[Req]:
        """`waiting` (in policy order) in SLO admission order (module doc). `ahead`:
        prefill tokens already planned before any of them (the request mid-chunk)."""
        per_token = self.step_ms(budget, decode_batch) / budget
        start = ahead * per_token
        out: list[Req] = []
        for prio in sorted({r.priority for r in waiting}, reverse=True):
            group = [r for r in waiting if r.priority == prio]
            ordered, spent = self._order_group(group, now, start, per_token)
            out += ordered
            start += spent
        return out

    def _deadline_ms(self, req: Req, now: float) -> float:
        """Ms from now to the request's TTFT deadline (inf without a target)."""
        ttft = self.targets(req)[0]
        if ttft is None:
            return math.inf
        return ttft - (now - req.arrival_time) * 1e3

    def _order_group(
        self, group: list[Req], now: float, start: float, per_token: float
    ) -> tuple[list[Req], float]:
        """One priority level: its order and the prefill ms it takes (Moore-Hodgson)."""
        work = {r: self.extend_of(r) * per_token for r in group}
        due = {r: self._deadline_ms(r, now) - start for r in group}
        by_deadline = sorted(group, key=lambda r: due[r])
        on_time: list[Req] = []
        total = 0.0
        for r in by_deadline:
            on_time.append(r)
            total += work[r]
            if total > due[r]:  # someone is late: drop the longest job so far
                longest = max(on_time, key=lambda j: work[j])
                on_time.remove(longest)
                total -= work[longest]
        keep = set(on_time)
        in_policy = [r for r in group if r in keep]
        if not self._meets(in_policy, work, due):
            in_policy = [r for r in by_deadline if r in keep]
        late = [r for r in group if r not in keep]
        return in_policy + late, sum(work.values())

    @staticmethod
    def _meets(order: list[Req], work: dict, due: dict) -> bool:
        t = 0.0
        for r in order:
            t += work[r]
            if t > due[r]:
                return False
        return True

    # ---- admission control -----------------------------------------------------------

    def predict_ttft_ms(
        self, req: Req, waiting: Sequence[Req], ahead: int, running: Sequence[Req]
    ) -> float:
        """TTFT predicted for `req` if queued now behind the waiting requests of its
        priority or higher and `ahead` tokens mid-chunk."""
        queue = ahead + sum(self.extend_of(r) for r in waiting if r.priority >= req.priority)
        tokens = queue + self.extend_of(req)
        budget = self.budget(running, req.arrival_time)
        full, last = divmod(tokens, budget)
        b = len(running)
        return full * self.step_ms(budget, b) + (self.step_ms(last, b) if last else 0.0)

    def admit(self, req: Req, waiting: Sequence[Req], ahead: int, running: Sequence[Req]) -> None:
        """Check a new request's TTFT target against the queue (module doc).

        Raises SLOUnattainableError (HTTP 429; retry_after_s: the predicted excess) when
        the target cannot be met and --slo-admission is reject; in queue mode logs a
        warning and queues it.
        """
        ttft = self.targets(req)[0]
        if ttft is None or not self.model.ready:
            return
        predicted = self.predict_ttft_ms(req, waiting, ahead, running)
        if predicted <= ttft:
            return
        message = (
            f"TTFT target {ttft:g} ms cannot be met: {predicted:.0f} ms predicted behind "
            f"{len(waiting)} waiting requests"
        )
        if self.reject:
            self.counters.rejected += 1
            raise SLOUnattainableError(message, retry_after_s=(predicted - ttft) / 1e3)
        self.counters.queued_late += 1
        logger.warning("request %s: %s; queued", req.rid, message)

    # ---- measurements ----------------------------------------------------------------

    def observe(self, prefill_tokens: int, decode_batch: int, seconds: float) -> None:
        """Feed one measured step to the step-time model."""
        self.model.observe(prefill_tokens, decode_batch, seconds * 1e3)

    def on_finish(self, req: Req, now: float) -> None:
        """Count a finished (not aborted) request against its targets."""
        ttft_target, tpot_target = self.targets(req)
        if req.first_token_time < 0:
            return
        ttft = (req.first_token_time - req.arrival_time) * 1e3
        n = len(req.output_ids)
        tpot = (now - req.first_token_time) * 1e3 / (n - 1) if n > 1 else 0.0
        ok_ttft = ttft_target is None or ttft <= ttft_target
        ok_tpot = tpot_target is None or tpot <= tpot_target
        c = self.counters
        c.finished += 1
        c.ttft_met += ok_ttft
        c.tpot_met += ok_tpot
        c.both_met += ok_ttft and ok_tpot

    def stats(self) -> dict[str, int | float]:
        """Goodput counters and budgets with stable public names (`/metrics`)."""
        c = self.counters
        return {
            "slo_finished_total": c.finished,
            "slo_ttft_met_total": c.ttft_met,
            "slo_tpot_met_total": c.tpot_met,
            "slo_both_met_total": c.both_met,
            "slo_rejected_total": c.rejected,
            "slo_queued_late_total": c.queued_late,
            "slo_prefill_budget": c.budget_last,
            "slo_prefill_budget_sum": c.budget_sum,
            "slo_budget_steps_total": c.budget_steps,
        }
