"""How the scheduler runs a decode step: plain (one token per request) or speculative.

The Scheduler picks one strategy at construction (`make_decode_strategy`) and calls
`decode(scheduler, reqs)` for every decode step and `after_forward(...)` after every
forward it runs itself (extend, mixed, plain decode), so a speculative drafter can keep
its own state (draft KV, EAGLE features) in sync without branches in the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.config import ServerArgs

if TYPE_CHECKING:
    from radixlm.kernels import ForwardBatch
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.sched.request import Req, ReqOutput
    from radixlm.runtime.sched.scheduler import Scheduler


class NormalDecode:
    """One target forward per decode step, one token per running request."""

    def decode(self, sched: Scheduler, reqs: list[Req]) -> list[ReqOutput]:
        """Run one decode step over `reqs` (the running requests); return their outputs."""
        return sched._run([], reqs)

    def after_forward(self, fb: ForwardBatch, reqs: list[Req], next_ids: dict) -> None:
        """Hook after each scheduler-run forward (nothing to do without speculation)."""

    def stats(self) -> dict[str, int | float]:
        """Counters merged into `Scheduler.stats()` (none)."""
        return {}


def make_decode_strategy(args: ServerArgs, runner: ModelRunner):
    """`NormalDecode`, or a `SpeculativeDecode` when --speculative-algorithm is set.

    Raises ValueError for a drafter that cannot be built (e.g. a missing draft path).
    """
    if args.speculative_algorithm is None:
        return NormalDecode()
    from radixlm.runtime.speculative import make_speculative_decode

    return make_speculative_decode(args, runner)
