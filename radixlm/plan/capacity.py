"""Memory capacity: weights, the KV budget left after a reserve, tokens and users that fit.

Per GPU of a `tp`-way tensor-parallel group:
    budget_kv  = memory * mem_fraction - weights / tp - reserve
    tokens     = floor(floor(budget_kv / kv_bytes_per_token_per_gpu) / page_size) * page_size
    users      = floor(tokens / context)
`mem_fraction` is the share of device memory given to weights plus KV (the rest holds
activations, CUDA graphs, the allocator's slack), like SGLang's ``--mem-fraction-static``
and vLLM's ``--gpu-memory-utilization``; `reserve` is an extra fixed amount. Every GPU of
the group holds its slice of every cached token, so the group's token capacity equals one
GPU's. The engine rounds its slot count down to a whole number of pages the same way,
which is what the agreement test checks. Weight bytes split evenly over TP ranks (the
small replicated norms are ignored).

KV replication (see `radixlm.plan.kv`): once tp exceeds the number of KV heads, adding
GPUs stops shrinking the per-GPU KV cost per token, so token capacity grows only through
the weight memory freed, not through the KV split; `tokens_without_replication` shows
the capacity an ideal split would give, to make the loss visible.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from radixlm.plan.cost import Deployment
from radixlm.plan.hardware import Hardware
from radixlm.plan.kv import kv_bytes_per_token, kv_bytes_per_token_per_gpu, kv_replication
from radixlm.plan.models import ModelSpec
from radixlm.plan.validate import FRACTION, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT
from radixlm.plan.weights import weights_bytes


@dataclass(frozen=True)
class Capacity:
    """Capacity of one TP configuration. Bytes are per GPU; tokens per replica."""

    tp: int
    weight_dtype: str
    kv_dtype: str
    weights_bytes_total: float
    weights_bytes_per_gpu: float
    kv_budget_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_replication: float
    max_tokens: int
    tokens_without_replication: int
    context: int
    max_users: int
    fits: bool

    def to_dict(self) -> dict:
        return asdict(self)


def tokens_that_fit(kv_budget_bytes: float, bytes_per_token: float, page_size: int = 1) -> int:
    """Whole pages of tokens that fit in `kv_budget_bytes` (0 when the budget is negative)."""
    POSITIVE.check("bytes_per_token", bytes_per_token)
    POSITIVE_INT.check("page_size", page_size)
    if kv_budget_bytes <= 0:
        return 0
    tokens = int(kv_budget_bytes // bytes_per_token)
    return tokens // page_size * page_size


def kv_budget_per_gpu(
    hw: Hardware,
    weights_total: float,
    tp: int = 1,
    mem_fraction: float = 0.9,
    reserve_bytes: float = 0.0,
) -> float:
    """Bytes left for KV on one GPU: memory * mem_fraction - weights / tp - reserve."""
    POSITIVE_INT.check("tp", tp)
    FRACTION.check("mem_fraction", mem_fraction)
    NON_NEGATIVE.check("reserve_bytes", reserve_bytes)
    return hw.memory_bytes * mem_fraction - weights_total / tp - reserve_bytes


def capacity(
    model: ModelSpec,
    hw: Hardware | None,
    *,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    context: int = 4096,
    mem_fraction: float = 0.9,
    reserve_bytes: float = 0.0,
    kv_budget_bytes: float | None = None,
    page_size: int = 1,
    group_size: int = 128,
) -> Capacity:
    """Capacity of `model` on `tp` GPUs of type `hw`.

    `kv_budget_bytes` (per GPU) overrides the budget computed from `hw`, e.g. to reproduce
    an engine whose budget is known; `hw` may then be None.

    Raises:
        ValueError: a parameter out of range (tp, page_size, group_size >= 1; context,
            reserve_bytes, kv_budget_bytes >= 0; mem_fraction in (0, 1]).
    """
    POSITIVE_INT.check("tp", tp)
    POSITIVE_INT.check("page_size", page_size)
    NON_NEGATIVE_INT.check("context", context)
    FRACTION.check("mem_fraction", mem_fraction)
    NON_NEGATIVE.check("reserve_bytes", reserve_bytes)
    w_total = weights_bytes(model, weight_dtype, group_size)
    if kv_budget_bytes is None:
        if hw is None:
            raise ValueError("capacity needs either hw or kv_budget_bytes")
        budget = kv_budget_per_gpu(hw, w_total, tp, mem_fraction, reserve_bytes)
    else:
        budget = float(NON_NEGATIVE.check("kv_budget_bytes", kv_budget_bytes))
    per_token = kv_bytes_per_token_per_gpu(model, kv_dtype, tp)
    ideal = kv_bytes_per_token(model, kv_dtype) / tp
    tokens = tokens_that_fit(budget, per_token, page_size)
    return Capacity(
        tp=tp,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        weights_bytes_total=w_total,
        weights_bytes_per_gpu=w_total / tp,
        kv_budget_bytes_per_gpu=budget,
        kv_bytes_per_token_per_gpu=per_token,
        kv_replication=kv_replication(model, tp),
        max_tokens=tokens,
        tokens_without_replication=tokens_that_fit(budget, ideal, page_size),
        context=context,
        max_users=tokens // context if context > 0 else 0,
        fits=budget > 0 and tokens >= max(1, context),
    )


def capacity_table(
    model: ModelSpec, hw: Hardware | None, tps: tuple[int, ...] = (1, 2, 4, 8), **kwargs
) -> list[Capacity]:
    """`capacity` for each tensor-parallel degree in `tps`."""
    return [capacity(model, hw, tp=tp, **kwargs) for tp in tps]


def min_tp_that_fits(
    model: ModelSpec, hw: Hardware, tps: tuple[int, ...] = (1, 2, 4, 8), **kwargs
) -> int | None:
    """Smallest TP degree whose KV budget holds at least one full-context sequence."""
    for tp in tps:
        if capacity(model, hw, tp=tp, **kwargs).fits:
            return tp
    return None


def weights_table(
    model: ModelSpec,
    dtypes: tuple[str, ...] = ("bf16", "fp8", "int8", "int4"),
    group_size: int = 128,
) -> list[dict]:
    """Resident weight bytes in each format, with the share of the bf16 size."""
    base = weights_bytes(model, "bf16", group_size)
    return [
        {
            "dtype": d,
            "bytes": weights_bytes(model, d, group_size),
            "ratio_to_bf16": weights_bytes(model, d, group_size) / base,
        }
        for d in dtypes
    ]


def gpus_for_weights(
    model: ModelSpec, hw: Hardware, weight_dtype: str = "bf16", mem_fraction: float = 0.9
) -> int:
    """Minimum GPUs whose usable memory holds the weights alone (no KV)."""
    FRACTION.check("mem_fraction", mem_fraction)
    return math.ceil(weights_bytes(model, weight_dtype) / (hw.memory_bytes * mem_fraction))


def max_decode_batch(
    dep: Deployment,
    *,
    avg_context: int,
    seq_tokens: int,
    tpot_slo_ms: float | None,
    mem_fraction: float = 0.9,
    reserve_bytes: float = 0.0,
    page_size: int = 1,
) -> tuple[int, str]:
    """Largest decode batch one replica can run, and what limits it ("memory" or "tpot").

    Memory: every sequence may grow to `seq_tokens` (prompt + output), so
    B_mem = floor(max_tokens / seq_tokens). Latency: the decode step at `avg_context` must
    not exceed the TPOT SLO; step time grows with B, so the largest such B is found by
    bisection. Returns (0, reason) when not even one sequence fits.
    """
    POSITIVE_INT.check("seq_tokens", seq_tokens)
    if tpot_slo_ms is not None:
        POSITIVE.check("tpot_slo_ms", tpot_slo_ms)
    cap = capacity(
        dep.model,
        dep.hw,
        tp=dep.tp,
        weight_dtype=dep.weight_dtype,
        kv_dtype=dep.kv_dtype,
        context=seq_tokens,
        mem_fraction=mem_fraction,
        reserve_bytes=reserve_bytes,
        page_size=page_size,
    )
    b_mem = cap.max_tokens // seq_tokens
    if b_mem == 0:
        return 0, "memory"
    if tpot_slo_ms is None:
        return b_mem, "memory"

    def ok(b: int) -> bool:
        return dep.decode(b, avg_context).time_s * 1e3 <= tpot_slo_ms

    if not ok(1):
        return 0, "tpot"
    if ok(b_mem):
        return b_mem, "memory"
    lo, hi = 1, b_mem
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, "tpot"
