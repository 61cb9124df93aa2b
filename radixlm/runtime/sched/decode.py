"""The decode contract between the scheduler and a decode strategy (plain or speculative).

Every decode step the Scheduler calls ``result = decoder.decode(ctx, reqs)`` with the
running requests and a `DecodeContext`, then commits the returned `DecodeResult` itself:
it appends the outputs, finishes the requests that stopped and updates its counters and
new-token ratio. A strategy changes only the requests it steps (their tokens and
kv_len) and KV slots through the ledger; it never touches the scheduler's queues or
counters. When `decode` raises, the scheduler aborts the whole batch (after a strategy
has freed any extra slots of its own and re-raised).

The scheduler also calls ``after_forward(...)`` after every forward it runs itself
(extend, mixed, plain decode), so a speculative drafter can keep its own state (draft KV,
EAGLE features) in sync without branches in the scheduler. The strategy is chosen where
the stack is built (`runtime/server/stack.py`) and passed to the Scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from radixlm.kernels import ForwardBatch
    from radixlm.runtime.sched.finish import FinishReason
    from radixlm.runtime.sched.kv_ledger import KVLedger
    from radixlm.runtime.sched.request import Req
    from radixlm.runtime.sched.stop import StopChecker


@dataclass
class DecodeResult:
    """What one step produced for its requests, committed by the Scheduler.

    Attributes:
        reqs: the requests that emitted tokens or finished this step, in batch order.
        new_ids: tokens emitted per request this step, already appended to its
            output_ids (its kv_len follows kv_len == len(all_ids) - 1); [] when a request
            finished without a token.
        reasons: finish reason per request ("stop", "length", ...), None while it runs.
        logprobs: per-request logprob entry of its token, or None (speculative steps
            carry none).
        decode_tokens: tokens emitted by decoding requests this step (one per request on a
            plain step, accepted drafts plus the bonus on a speculative one; counted in
            `SchedulerCounters.decode_tokens`).
    """

    reqs: list[Req] = field(default_factory=list)
    new_ids: list[list[int]] = field(default_factory=list)
    reasons: list[FinishReason | None] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    decode_tokens: int = 0


@dataclass
class DecodeContext:
    """What a decode strategy may use of the scheduler.

    Attributes:
        kv: the KV ledger: slot allocation (`alloc`), freeing a row's tail (`truncate`),
            room (free + evictable slots), page size and the int32 request-to-token table.
        stop: the stop checker a strategy runs on every token it emits.
        plain_decode: runs the plain decode step (one target forward, one sampled token
            per request, stop checks done) over the given requests and returns its
            result; it does not commit it. Exceptions propagate to the strategy.
    """

    kv: KVLedger
    stop: StopChecker
    plain_decode: Callable[[list[Req]], DecodeResult]


class DecodeStrategy(Protocol):
    """A decode step over the running requests, and the hooks the scheduler calls.

    Attributes:
        allows_jump_forward: whether jump-forward drafts (`jump.py`, verified in the plain
            forward path) may run beside this strategy: it must decode every constrained
            request with `plain_decode` and keep no state per forwarded position (a
            drafted row forwards positions that its verify may drop).
        constrained_lookup: a model-free draft of a request's continuation, token ids
            (`Drafter.lookup`), which constrained requests verify beside jump-forward
            where their grammar forces nothing; None: none.
        riding_lookup: the same kind of drafts for the unconstrained requests that ride
            along in a mixed step (the strategy does not step them there), one list per
            request, verified in the plain forward path beside the step's prefill; [] for
            a request the strategy would not speculate; None: none.
    """

    allows_jump_forward: bool
    constrained_lookup: Callable[[Req], list[int]] | None
    riding_lookup: Callable[[list[Req]], list[list[int]]] | None

    def decode(self, ctx: DecodeContext, reqs: list[Req]) -> DecodeResult:
        """Run one decode step over `reqs` (the running requests); return its result."""
        ...

    def after_forward(self, fb: ForwardBatch, reqs: list[Req], next_ids: dict) -> None:
        """Called after each forward the scheduler runs itself, with the batch's requests
        and the token each sampling request sampled."""
        ...

    def stats(self) -> dict[str, int | float]:
        """Counters merged into `Scheduler.stats()`."""
        ...


class NormalDecode:
    """One target forward per decode step, one token per running request."""

    allows_jump_forward = True
    constrained_lookup = None
    riding_lookup = None

    def decode(self, ctx: DecodeContext, reqs: list[Req]) -> DecodeResult:
        """Run one plain decode step over `reqs` (the running requests)."""
        return ctx.plain_decode(reqs)

    def after_forward(self, fb: ForwardBatch, reqs: list[Req], next_ids: dict) -> None:
        """Hook after each scheduler-run forward (nothing to do without speculation)."""

    def stats(self) -> dict[str, int | float]:
        """Counters merged into `Scheduler.stats()` (none)."""
        return {}
