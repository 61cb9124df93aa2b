"""Speculative decoding: expected tokens per step, speed-up, and where it stops paying.

Expected tokens per verification step (Leviathan, Kalman, Matias 2023, "Fast Inference
from Transformers via Speculative Decoding", eq. 1): with a draft of k tokens, each
accepted independently with probability a (the acceptance rate), the target emits the
accepted prefix plus one token of its own (a correction or a bonus token), so
    E[tokens] = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a)        (= k + 1 when a = 1).

Speed-up at batch 1 (Leviathan et al., theorem 3.8): a step costs k draft steps of
relative cost c (draft step time / target step time) plus one target pass that verifies
k + 1 tokens at the price of one ordinary decode step (decode is memory-bound), so
    speed-up = (1 - a^(k+1)) / ((1 - a) (k c + 1)).

Batch-aware speed-up (this planner): the verify pass is priced with the roofline
(`radixlm.plan.cost`): B sequences each with k + 1 query tokens after L cached ones,
    speed-up(B) = E[tokens] * t_decode(B) / (k * t_draft(B) + t_verify(B, k + 1)).
While decode is memory-bound, t_verify ~= t_decode and speculation pays; past the knee
the verify pass costs about (k + 1) t_decode — the rejected draft tokens are paid in
FLOPs — and the speed-up falls toward E / (k c + k + 1) < 1. The break-even batch is the
smallest B with speed-up(B) <= 1: above it, serve without speculation. At long
contexts the KV reads keep even large-batch decode memory-bound, so verification stays
nearly free and speculation keeps paying at any batch (the observation of Chen et al.
2024, "MagicDec"); the model then reports no break-even.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.plan.cost import Deployment
from radixlm.plan.validate import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, PROBABILITY


def expected_tokens(acceptance: float, draft_len: int) -> float:
    """(1 - a^(k+1)) / (1 - a): expected tokens emitted per verification step."""
    PROBABILITY.check("acceptance", acceptance)
    NON_NEGATIVE_INT.check("draft_len", draft_len)
    if acceptance == 1.0:
        return draft_len + 1.0
    return (1.0 - acceptance ** (draft_len + 1)) / (1.0 - acceptance)


def leviathan_speedup(acceptance: float, draft_len: int, draft_cost: float) -> float:
    """Batch-1 walltime improvement, (1 - a^(k+1)) / ((1 - a)(k c + 1))."""
    NON_NEGATIVE.check("draft_cost", draft_cost)
    return expected_tokens(acceptance, draft_len) / (draft_len * draft_cost + 1.0)


def best_draft_len(acceptance: float, draft_cost: float, max_len: int = 16) -> int:
    """Draft length maximizing the batch-1 speed-up."""
    POSITIVE_INT.check("max_len", max_len)
    return max(range(1, max_len + 1), key=lambda k: leviathan_speedup(acceptance, k, draft_cost))


@dataclass(frozen=True)
class SpecPoint:
    batch: int
    decode_ms: float
    draft_ms: float
    verify_ms: float
    tokens_per_step: float
    speedup: float


class SpecModel:
    """Batch-aware speculative decoding on a deployment.

    Draft cost is either `draft_cost` (draft step time as a fraction of the target's
    decode step at the same batch; about 0 for n-gram lookup, 0.05-0.1 for EAGLE-style
    heads) or a `draft` deployment (a smaller model on the same GPUs) priced by the
    roofline.
    """

    def __init__(
        self,
        target: Deployment,
        acceptance: float,
        draft_len: int,
        context: int,
        draft_cost: float = 0.05,
        draft: Deployment | None = None,
    ):
        PROBABILITY.check("acceptance", acceptance)
        POSITIVE_INT.check("draft_len", draft_len)
        NON_NEGATIVE_INT.check("context", context)
        NON_NEGATIVE.check("draft_cost", draft_cost)
        self.target, self.draft = target, draft
        self.acceptance, self.k, self.context = acceptance, draft_len, context
        self.draft_cost = draft_cost

    def point(self, batch: int) -> SpecPoint:
        POSITIVE_INT.check("batch", batch)
        dec = self.target.decode(batch, self.context).time_s
        if self.draft is not None:
            draft = self.draft.decode(batch, self.context).time_s
        else:
            draft = self.draft_cost * dec
        verify = self.target.step(
            chunk=self.k + 1, chunk_prefix=self.context, chunk_seqs=batch
        ).time_s
        tokens = expected_tokens(self.acceptance, self.k)
        speedup = tokens * dec / (self.k * draft + verify)
        return SpecPoint(batch, dec * 1e3, draft * 1e3, verify * 1e3, tokens, speedup)

    def break_even_batch(self, max_batch: int = 1 << 16) -> int | None:
        """Smallest batch at which speculation no longer speeds decoding up (speed-up
        <= 1); 1 if it never pays, None if it still pays at `max_batch`.

        Doubling search, then bisection (the speed-up falls with batch size).
        """
        if self.point(1).speedup <= 1.0:
            return 1
        lo, hi = 1, 2
        while self.point(hi).speedup > 1.0:
            if hi >= max_batch:
                return None
            lo, hi = hi, min(hi * 2, max_batch)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.point(mid).speedup > 1.0:
                lo = mid
            else:
                hi = mid
        return hi
