"""Prefill/decode disaggregation: KV transfer cost vs colocation interference, and the
prefill:decode pool ratio.

Disaggregated serving (Zhong et al. 2024, "DistServe", OSDI; Patel et al. 2024,
"Splitwise", ISCA; Qin et al. 2024, "Mooncake") runs prefill and decode on separate
GPU pools and ships each request's KV cache from the prefill to the decode pool.

Transfer (per GPU of a TP group, each GPU sending its own KV slice over its own NIC):
    kv_bytes   = P * kv_bytes_per_token_per_gpu
    t_transfer = kv_bytes / link_bandwidth
Prefill emits KV at P / t_prefill tokens per second, so the link keeps up with the
prefill pool, and transfers can hide behind prefill layer by layer, when
    link_bandwidth >= kv_bytes_per_token_per_gpu * P / t_prefill     (break-even bandwidth)
i.e. t_transfer <= t_prefill. For a compute-bound prefill t_prefill ~= 2 N P / F (N
params, F FLOP/s per GPU group), so the break-even bandwidth ~= k F / (2 N) hardly
depends on P: it is a property of the model's KV density and the GPU.

Interference (the cost disaggregation removes): a prefill of P tokens colocated with B
running decodes turns one decode step of t_decode into t_mixed = step(B decodes + P
prefill tokens), so each of the B requests sees an inter-token stall of
    stall = t_mixed - t_decode
(chunked prefill spreads it over ceil(P / C) steps; `radixlm.plan.chunk`). When stall
exceeds the TPOT slack (SLO - t_decode), colocation without chunking misses the SLO.
Disaggregation pays on latency when t_transfer < stall; it always costs link bandwidth.

Pool ratio (DistServe, section 4): a prefill instance serves 1 / t_prefill requests/s
(prefill is compute-bound, batching prompts does not raise its token rate); a decode
instance serves B_d / (O * t_decode(B_d)) requests/s at the largest batch B_d meeting the
TPOT SLO and memory. Balanced pools need
    N_prefill : N_decode = t_prefill : O * t_decode(B_d) / B_d.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from radixlm.plan.capacity import max_decode_batch
from radixlm.plan.cost import Deployment
from radixlm.plan.validate import FRACTION, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT


@dataclass(frozen=True)
class DisaggPlan:
    prompt: int
    output: int
    kv_bytes_per_request: float  # whole request, all TP ranks
    kv_bytes_per_gpu: float  # one GPU's slice
    link_bandwidth: float  # bytes/s per GPU
    transfer_ms: float
    prefill_ms: float
    break_even_bandwidth: float  # bytes/s per GPU at which transfer = prefill
    colocated_decode_batch: int
    decode_ms: float
    mixed_step_ms: float
    stall_ms: float
    tpot_slo_ms: float
    colocated_meets_tpot: bool
    transfer_hidden_by_prefill: bool
    disagg_pays_on_latency: bool
    decode_batch: int
    decode_limit: str
    decode_step_ms: float
    prefill_rps_per_instance: float
    decode_rps_per_instance: float
    prefill_to_decode_ratio: float  # N_prefill / N_decode

    def to_dict(self) -> dict:
        return asdict(self)


def plan_disagg(
    dep: Deployment,
    *,
    prompt: int,
    output: int,
    link_bandwidth: float,
    tpot_slo_ms: float,
    colocated_batch: int = 32,
    link_latency_s: float = 0.0,
    mem_fraction: float = 0.9,
) -> DisaggPlan:
    """Transfer vs interference for one request profile, and the pool ratio (module doc).

    `link_bandwidth` is bytes/s per GPU; `colocated_batch` the decodes a colocated
    prefill would interrupt.

    Raises:
        ValueError: prompt or output < 1, link_bandwidth or tpot_slo_ms <= 0, a negative
            colocated_batch or link_latency_s, or mem_fraction outside (0, 1].
    """
    POSITIVE_INT.check("prompt", prompt)
    POSITIVE_INT.check("output", output)
    POSITIVE.check("link_bandwidth", link_bandwidth)
    POSITIVE.check("tpot_slo_ms", tpot_slo_ms)
    NON_NEGATIVE_INT.check("colocated_batch", colocated_batch)
    NON_NEGATIVE.check("link_latency_s", link_latency_s)
    FRACTION.check("mem_fraction", mem_fraction)
    kv_gpu = prompt * dep.kv_per_token
    kv_total = prompt * dep.kv_per_token * dep.tp
    transfer_s = kv_gpu / link_bandwidth + link_latency_s
    prefill_s = dep.prefill(prompt).time_s
    break_even = kv_gpu / prefill_s
    ctx = prompt + output // 2
    decode_s = dep.decode(colocated_batch, ctx).time_s
    mixed_s = dep.step(decode_batch=colocated_batch, context=ctx, chunk=prompt).time_s
    stall_s = mixed_s - decode_s
    b_d, limit = max_decode_batch(
        dep,
        avg_context=ctx,
        seq_tokens=prompt + output,
        tpot_slo_ms=tpot_slo_ms,
        mem_fraction=mem_fraction,
    )
    step_d = dep.decode(b_d, ctx).time_s if b_d else float("inf")
    prefill_rps = 1.0 / prefill_s
    decode_rps = b_d / (output * step_d) if b_d else 0.0
    ratio = decode_rps / prefill_rps if decode_rps else float("inf")
    return DisaggPlan(
        prompt=prompt,
        output=output,
        kv_bytes_per_request=kv_total,
        kv_bytes_per_gpu=kv_gpu,
        link_bandwidth=link_bandwidth,
        transfer_ms=transfer_s * 1e3,
        prefill_ms=prefill_s * 1e3,
        break_even_bandwidth=break_even,
        colocated_decode_batch=colocated_batch,
        decode_ms=decode_s * 1e3,
        mixed_step_ms=mixed_s * 1e3,
        stall_ms=stall_s * 1e3,
        tpot_slo_ms=tpot_slo_ms,
        colocated_meets_tpot=mixed_s * 1e3 <= tpot_slo_ms,
        transfer_hidden_by_prefill=transfer_s <= prefill_s,
        disagg_pays_on_latency=transfer_s < stall_s,
        decode_batch=b_d,
        decode_limit=limit,
        decode_step_ms=step_d * 1e3,
        prefill_rps_per_instance=prefill_rps,
        decode_rps_per_instance=decode_rps,
        prefill_to_decode_ratio=ratio,
    )
