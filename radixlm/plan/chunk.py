"""Chunked-prefill token budget under a TPOT SLO and a TTFT SLO.

Setting (Agrawal et al. 2024, "Taming Throughput-Latency Tradeoff in LLM Inference with
Sarathi-Serve", stall-free batching): B requests are decoding at context L when a prompt
of P tokens arrives. Every step runs the B decode tokens plus one prefill chunk of C
tokens of the new prompt, so
  * each decoding request sees one token per step: its inter-token latency (TPOT) is the
    step time. The worst step is the last chunk, which attends to the P - C tokens before
    it:  t(C) = step(B decodes at L, chunk C after P - C cached)  <=  TPOT SLO.
    t(C) grows with C (the chunk's FLOPs grow; its KV traffic does not), so the largest
    admissible chunk C_max is found by bisection.
  * the new prompt's first token arrives after ceil(P / C) steps:
        TTFT(C) = sum_i step(B decodes, chunk_i after its predecessors)  <=  TTFT SLO.
    Larger chunks need fewer steps, each of which re-reads the weights, so TTFT falls
    with C; C_min, the smallest chunk meeting the TTFT SLO (searched by bisection over
    powers of two below `align` and multiples of `align`), is reported.
Both SLOs hold for C in [C_min, C_max]. The recommendation is C_max rounded down to a
multiple of `align` (the most prefill work per step that TPOT allows), or C_max itself
when the rounding would miss the TTFT SLO; the plan is feasible when the recommended
chunk meets the TTFT SLO. The per-step
token budget in Sarathi's sense is B + C. Step times come from `radixlm.plan.cost`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixlm.plan.cost import Deployment
from radixlm.plan.validate import NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT


@dataclass(frozen=True)
class ChunkPlan:
    decode_batch: int
    context: int
    prompt: int
    tpot_slo_ms: float
    ttft_slo_ms: float
    decode_only_ms: float
    max_chunk: int  # C_max: largest chunk meeting TPOT (0 if none)
    min_chunk: int | None  # C_min: smallest chunk meeting TTFT (None if none)
    recommended_chunk: int | None
    token_budget: int | None  # decode_batch + recommended_chunk
    itl_ms: float | None  # worst step time with the recommended chunk
    ttft_ms: float | None  # TTFT with the recommended chunk
    whole_prompt_ms: float  # one-step prefill of the prompt alongside the decodes
    feasible: bool
    reason: str


def worst_step_ms(dep: Deployment, batch: int, context: int, prompt: int, chunk: int) -> float:
    """Step time of the prompt's last chunk (prefix prompt - chunk) next to B decodes."""
    return (
        dep.step(
            decode_batch=batch, context=context, chunk=chunk, chunk_prefix=prompt - chunk
        ).time_s
        * 1e3
    )


def ttft_ms(dep: Deployment, batch: int, context: int, prompt: int, chunk: int) -> float:
    """Sum of the step times that prefill `prompt` in chunks of `chunk` next to B decodes."""
    total, done = 0.0, 0
    while done < prompt:
        size = min(chunk, prompt - done)
        total += dep.step(decode_batch=batch, context=context, chunk=size, chunk_prefix=done).time_s
        done += size
    return total * 1e3


def plan_chunk(
    dep: Deployment,
    *,
    decode_batch: int,
    context: int,
    prompt: int,
    tpot_slo_ms: float,
    ttft_slo_ms: float,
    align: int = 64,
) -> ChunkPlan:
    """The chunk-size window meeting both SLOs, and the recommended chunk (module doc).

    Raises:
        ValueError: prompt or align < 1, decode_batch or context < 0, or an SLO <= 0.
    """
    POSITIVE_INT.check("prompt", prompt)
    POSITIVE_INT.check("align", align)
    NON_NEGATIVE_INT.check("decode_batch", decode_batch)
    NON_NEGATIVE_INT.check("context", context)
    POSITIVE.check("tpot_slo_ms", tpot_slo_ms)
    POSITIVE.check("ttft_slo_ms", ttft_slo_ms)
    base = dict(
        decode_batch=decode_batch,
        context=context,
        prompt=prompt,
        tpot_slo_ms=tpot_slo_ms,
        ttft_slo_ms=ttft_slo_ms,
    )
    decode_only = dep.decode(decode_batch, context).time_s * 1e3 if decode_batch else 0.0
    whole = worst_step_ms(dep, decode_batch, context, prompt, prompt)

    def fits_tpot(c: int) -> bool:
        return worst_step_ms(dep, decode_batch, context, prompt, c) <= tpot_slo_ms

    c_max = 0
    if fits_tpot(1):
        lo, hi = 1, prompt
        if fits_tpot(hi):
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits_tpot(mid):
                lo = mid
            else:
                hi = mid
        c_max = lo

    small = [1 << i for i in range(align.bit_length()) if (1 << i) < align]
    candidates = sorted(
        {c for c in small if c <= prompt} | {*range(align, prompt + 1, align), prompt}
    )
    c_min = None
    if ttft_ms(dep, decode_batch, context, prompt, candidates[-1]) <= ttft_slo_ms:
        lo, hi = -1, len(candidates) - 1  # candidates[hi] meets TTFT
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ttft_ms(dep, decode_batch, context, prompt, candidates[mid]) <= ttft_slo_ms:
                hi = mid
            else:
                lo = mid
        c_min = candidates[hi]

    if c_max == 0:
        one = worst_step_ms(dep, decode_batch, context, prompt, 1)
        reason = (
            f"TPOT SLO {tpot_slo_ms:g} ms is below the step time with a 1-token chunk, "
            f"{one:.2f} ms (decode alone takes {decode_only:.2f} ms)"
        )
        return ChunkPlan(
            **base,
            decode_only_ms=decode_only,
            max_chunk=0,
            min_chunk=c_min,
            recommended_chunk=None,
            token_budget=None,
            itl_ms=None,
            ttft_ms=None,
            whole_prompt_ms=whole,
            feasible=False,
            reason=reason,
        )
    rec = c_max // align * align if c_max >= align else c_max
    ttft = ttft_ms(dep, decode_batch, context, prompt, rec)
    if ttft > ttft_slo_ms and rec != c_max:
        rec, ttft = c_max, ttft_ms(dep, decode_batch, context, prompt, c_max)
    feasible = ttft <= ttft_slo_ms
    if feasible:
        low = min(c_min or rec, rec)
        reason = f"chunks from about {low} up to {c_max} meet both SLOs"
    elif c_min is None:
        reason = f"TTFT SLO {ttft_slo_ms} ms is missed even prefilling the prompt in one step"
    else:
        reason = (
            f"TTFT needs chunks >= about {c_min} but TPOT allows <= {c_max}: the SLO "
            "pair conflicts at this batch; lower the decode batch or add GPUs"
        )
    return ChunkPlan(
        **base,
        decode_only_ms=decode_only,
        max_chunk=c_max,
        min_chunk=c_min,
        recommended_chunk=rec,
        token_budget=decode_batch + rec,
        itl_ms=worst_step_ms(dep, decode_batch, context, prompt, rec),
        ttft_ms=ttft,
        whole_prompt_ms=whole,
        feasible=feasible,
        reason=reason,
    )


def steps_for_prompt(prompt: int, chunk: int) -> int:
    POSITIVE_INT.check("chunk", chunk)
    return math.ceil(prompt / chunk)
