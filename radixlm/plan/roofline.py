"""Roofline analysis of prefill and decode (Williams, Waterman, Patterson 2009).

Ridge point: the arithmetic intensity at which a kernel stops being memory-bound,
    I_ridge = peak_flops / bandwidth   [FLOP/byte]
(H100 SXM in bf16: 989.5e12 / 3.35e12 = 295 FLOP/byte).

Decode step of B sequences at context L (dense model, per GPU, `radixlm.plan.cost`):
    FLOPs = B * (2 P + a L),   bytes = W + B (L + 1) k
with P matmul parameters, a attention FLOPs per cached token, W weight bytes, k KV bytes
per token. Intensity I(B) = B (2P + aL) / (W + B (L+1) k) grows with B toward
(2P + aL) / ((L+1) k). Setting I(B) = I_ridge gives the knee, the batch at which decode
turns compute-bound:
    B_knee = I_ridge W / (2P + aL - I_ridge (L+1) k)
and there is no knee when the denominator is <= 0: at long contexts the KV reads, whose
own intensity is only about a / k (the GQA group size for bf16 attention), keep decode
memory-bound at any batch. For bf16 weights with short contexts, I(B) ~= B, so the knee
sits near B = I_ridge. For MoE models W depends on B (experts touched), so the knee is
found numerically; the crossing is unique because compute - memory time is convex in B.

Prefill of a prompt of S tokens reads the weights once for S tokens: I ~= S for bf16, so
prefill is compute-bound once S exceeds the ridge (a few hundred tokens on GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.plan.cost import Deployment
from radixlm.plan.validate import POSITIVE_INT

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class CurvePoint:
    batch: int
    intensity: float
    compute_ms: float
    memory_ms: float
    step_ms: float
    tokens_per_s: float
    achieved_tflops: float
    bound: str


def ridge_point(dep: Deployment) -> float:
    """Peak FLOP/s over bandwidth for the deployment's compute precision (FLOP/byte)."""
    return dep.peak_flops / dep.hw.mem_bandwidth


def decode_curve(
    dep: Deployment, context: int, batches: tuple[int, ...] = DEFAULT_BATCHES
) -> list[CurvePoint]:
    """Predicted decode step time and throughput along the batch sizes (each >= 1)."""
    out = []
    for b in batches:
        POSITIVE_INT.check("batch", b)
        s = dep.decode(b, context)
        out.append(
            CurvePoint(
                b,
                s.intensity,
                s.compute_s * 1e3,
                s.memory_s * 1e3,
                s.time_s * 1e3,
                b / s.time_s,
                s.flops / s.time_s / 1e12,
                s.bound,
            )
        )
    return out


def knee_closed_form(dep: Deployment, context: int) -> float | None:
    """B_knee = I_ridge W / (2P + aL - I_ridge (L+1) k) for a dense model (module doc);
    None when decode never turns compute-bound. Fractional batch."""
    from radixlm.plan.weights import weights_read_bytes

    m = dep.model
    ridge = ridge_point(dep)
    w = weights_read_bytes(m, 1, dep.weight_dtype) / dep.tp
    per_seq_flops = (
        2.0 * m.matmul_params_per_token() + m.attn_flops_per_context_token() * context
    ) / dep.tp
    denom = per_seq_flops - ridge * (context + 1) * dep.kv_per_token
    return ridge * w / denom if denom > 0 else None


def decode_knee(dep: Deployment, context: int, max_batch: int = 1 << 24) -> int | None:
    """Smallest integer batch whose decode step is compute-bound, or None up to `max_batch`.

    Bisection on the sign of compute time - memory time (unique crossing, module doc).
    """

    def compute_bound(b: int) -> bool:
        s = dep.decode(b, context)
        return s.compute_s >= s.memory_s

    if not compute_bound(max_batch):
        return None
    lo, hi = 0, 1
    while not compute_bound(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if compute_bound(mid):
            hi = mid
        else:
            lo = mid
    return hi


def prefill_points(dep: Deployment, prompts: tuple[int, ...]) -> list[dict]:
    """Arithmetic intensity, time and throughput of prefilling one prompt of each length."""
    out = []
    for p in prompts:
        POSITIVE_INT.check("prompt", p)
        s = dep.prefill(p)
        out.append(
            {
                "prompt": p,
                "intensity": s.intensity,
                "step_ms": s.time_s * 1e3,
                "tokens_per_s": p / s.time_s,
                "bound": s.bound,
            }
        )
    return out


def plot_roofline(
    dep: Deployment,
    context: int,
    curve: list[CurvePoint],
    prefill: list[dict],
    path: str,
    knee: int | None = None,
) -> str:
    """Write a two-panel PNG: the roofline with decode/prefill points, and decode
    tokens/s vs batch. Needs matplotlib (optional dependency); returns `path`.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ridge = ridge_point(dep)
    peak = dep.peak_flops / 1e12
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [0.1, ridge, max(ridge * 100, 1e4)]
    ax1.loglog(
        xs,
        [min(x * dep.hw.mem_bandwidth / 1e12, peak) for x in xs],
        "k-",
        label=f"roof (ridge {ridge:.0f} FLOP/B)",
    )
    ax1.loglog(
        [p.intensity for p in curve],
        [p.achieved_tflops for p in curve],
        "o-",
        label=f"decode, ctx {context}",
    )
    ax1.loglog(
        [p["intensity"] for p in prefill],
        [min(p["intensity"] * dep.hw.mem_bandwidth, dep.peak_flops) / 1e12 for p in prefill],
        "s--",
        label="prefill",
    )
    ax1.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax1.set_ylabel("attainable TFLOP/s per GPU")
    ax1.legend(fontsize=8)
    ax2.loglog([p.batch for p in curve], [p.tokens_per_s for p in curve], "o-")
    if knee:
        ax2.axvline(knee, color="grey", linestyle=":", label=f"knee (batch {knee})")
        ax2.legend(fontsize=8)
    ax2.set_xlabel("decode batch")
    ax2.set_ylabel("tokens/s per replica")
    fig.suptitle(f"{dep.model.name} on {dep.tp}x {dep.hw.name} ({dep.weight_dtype})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
