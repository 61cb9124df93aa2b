"""The scheduler side of jump-forward decoding (`runtime/sampling/jump_forward.py`).

After a constrained request samples a token that does not end it, `jump_after_sample`
appends the grammar's forced continuation to its output (the sampled token may be
re-spelled by the boundary re-tokenization), cut by max_new_tokens and the context and
checked for stop tokens and strings token by token, as decoding would check them. The
appended tokens are not in the KV yet: the request then holds
``seq_len - kv_len > 1`` uncomputed tokens, and `split_pending` turns it from a decode
row into an extend row of the next forward, which computes them all and samples the
token after them. Its matcher has accepted exactly its ``output_ids`` throughout.
"""

from __future__ import annotations

from radixlm.runtime.sampling.jump_forward import JumpForward
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.stop import StopChecker


def can_jump(req: Req) -> bool:
    """Whether `req` may jump: it has a grammar and asks for no logprobs (appended
    tokens have none)."""
    return req.grammar is not None and not req.return_logprob


def jump_after_sample(
    req: Req, jumper: JumpForward, stop: StopChecker
) -> tuple[list[int], FinishReason | None]:
    """Append the forced continuation after `req`'s newest token (sampled this step,
    accepted by its matcher, not finishing it).

    Returns this step's new tokens (the sampled one, or its re-spelling, followed by the
    appended ones) and the finish reason they reached (None while it runs on).
    """
    tok = req.output_ids[-1]
    room = min(req.remaining_new_tokens(), stop.context_len - req.seq_len)
    replace, ids = jumper.continuation(req.grammar, tok, room)
    if not ids:
        return [tok], None
    if replace:
        req.output_ids.pop()
    new = [] if replace else [tok]
    for i, t in enumerate(ids):
        req.output_ids.append(t)
        new.append(t)
        reason = stop.check(req, t)
        if reason is None and req.seq_len >= stop.context_len:
            reason = FinishReason.LENGTH  # decoding's context check, on the full sequence
        if reason is not None:
            if i + 1 < len(ids):
                req.grammar.rollback(len(ids) - i - 1)
            return new, reason
    return new, None


def split_pending(plan: list[tuple[Req, int]], decodes: list[Req]):
    """Move the decoding requests holding jumped tokens (``seq_len - kv_len > 1``) into
    the extend plan, with all their uncomputed tokens; returns ``(plan, decodes)``."""
    pending = [r for r in decodes if r.seq_len - r.kv_len > 1]
    if not pending:
        return plan, decodes
    rest = [r for r in decodes if r.seq_len - r.kv_len <= 1]
    return plan + [(r, r.seq_len - r.kv_len) for r in pending], rest
