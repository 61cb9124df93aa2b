"""Memory-pressure policy: the adaptive new-token estimate and the retraction order.

Admission does not reserve every running request's full ``max_new_tokens`` (most stop
early, so that would leave the pool mostly idle); it reserves ``ratio * remaining`` for
each, with a ratio that decays while decoding goes well and jumps back up after a
retraction -- SGLang's ``new_token_ratio`` scheme (python/sglang/srt/managers/
scheduler.py: init 0.7 scaled by ``--schedule-conservativeness``, floor 0.14 x init,
linear decay to the floor over 600 decode steps).

When a decode step still lacks KV slots, the scheduler's `Retractor` retracts running
requests in `retraction_order` until the others fit: lowest priority first (`priority.py`), then
fewest generated tokens (least decode work lost), then longest prompt (most slots freed)
-- SGLang's ``ScheduleBatch.retract_decode`` order within one priority.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixlm.runtime.sched.stats import format_stats

if TYPE_CHECKING:
    from radixlm.runtime.sched.request import Req
    from radixlm.runtime.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)

#: Decode steps a retraction should buy before the next one (SGLang: 20).
RETRACT_DECODE_STEPS = 20


class NewTokenRatio:
    """Fraction of a running request's remaining ``max_new_tokens`` that admission reserves.

    Args:
        conservativeness: scales init and minimum (``--schedule-conservativeness``).
        init: starting ratio (before scaling). min_factor: floor as a fraction of init.
        decay_steps: decode steps to decay from init to the floor.
    """

    def __init__(
        self,
        conservativeness: float = 1.0,
        init: float = 0.7,
        min_factor: float = 0.14,
        decay_steps: int = 600,
    ):
        self.init = min(1.0, init * conservativeness)
        self.floor = self.init * min_factor
        self.decay = (self.init - self.floor) / decay_steps
        self.value = self.init

    def on_decode_step(self) -> None:
        """One decode step ran without retraction: relax the estimate."""
        self.value = max(self.floor, self.value - self.decay)

    def on_retract(self, running: Sequence[Any]) -> None:
        """A retraction happened: re-estimate from what the remaining requests did.

        running: requests still decoding (``output_ids``, ``params.max_new_tokens``).
        The new ratio covers their decoded tokens plus RETRACT_DECODE_STEPS more each,
        as a fraction of their total max_new_tokens (clamped to [current, 1]).
        """
        total = sum(r.params.max_new_tokens for r in running)
        if total <= 0:
            self.value = 1.0
            return
        decoded = sum(len(r.output_ids) for r in running)
        estimate = (decoded + RETRACT_DECODE_STEPS * len(running)) / total
        self.value = min(1.0, max(self.value, estimate))


def retraction_order(candidates: Sequence[Any]) -> list[Any]:
    """Requests in the order to retract them: lowest priority, then fewest output tokens,
    then longest prompt."""
    return sorted(candidates, key=lambda r: (r.priority, len(r.output_ids), -len(r.input_ids)))


class Retractor:
    """Makes KV room for decodes in one `Scheduler` by retracting its requests."""

    def __init__(self, sched: Scheduler):
        self.sched = sched

    def make_room_for_decode(self) -> None:
        """Retract requests until every running request can get one more slot."""
        s = self.sched

        def short() -> int:
            return s.kv.decode_tokens(s.running) - s.kv.room()

        if short() <= 0:
            return
        for req in retraction_order(s.running + ([s.chunked] if s.chunked else [])):
            if short() <= 0 or (req is not s.chunked and len(s.running) == 1):
                continue
            self.retract(req)
        while short() > 0 and s.pins.release_oldest() is not None:
            pass  # the last resort: a pin never stops the one running request
        s.ratio.on_retract(s.running)
        logger.info("retracted; new_token_ratio %.3f, %s", s.ratio.value, format_stats(s.stats()))

    def retract(self, req: Req) -> None:
        """Cache the request's computed KV, free its row, requeue it at the front."""
        s = self.sched
        if req is s.chunked:
            s.chunked = None
        else:
            s.running.remove(req)
        s.kv.retract(req)
        s.waiting.insert(0, req)
        s.counters.retracted += 1
