"""What the serving stack reports about itself: the limits a front end validates against
(`model_facts`), the `/get_server_info` payload (`server_info`), and cache flushing."""

from __future__ import annotations

import dataclasses
from typing import Any

from radixlm import omp_policy
from radixlm.config import ServerArgs
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.sched.scheduler import Scheduler
from radixlm.runtime.server.stack import ServingStack


def model_facts(stack: ServingStack) -> dict[str, int]:
    """Limits a front end needs to validate requests without the model."""
    return {
        "vocab_size": stack.config.vocab_size,
        "context_length": stack.runner.context_len,
        "max_total_tokens": stack.runner.max_total_tokens,
    }


def server_info(args: ServerArgs, runner: ModelRunner, scheduler: Scheduler) -> dict[str, Any]:
    """Settings, KV capacity and pool counters (tokens unless stated): the payload of
    `Engine.get_server_info()` and `GET /get_server_info`. `args` echoes the settings as
    given; `resolved` says what they chose: the attention backend class (after `auto`
    and any fallback, e.g. `cpu` -> TorchNativeBackend where the C kernels cannot run)
    and the CPU weight layout (`packed`, `input-major`, or None on CUDA), its weight format
    (`gguf` or `fp32` for packed panels, else None) and how many projections it keeps as
    quantized GGUF panels (`quantized_weights`), the KV pool's storage dtype
    (`kv_cache_dtype`, e.g. "float8_e4m3fn") and an fp8 pool's per-layer scales
    (`kv_scales`: {"k": [...], "v": [...]}, None for other pools). `moe` (None for a
    dense model) gives the distinct experts per MoE layer per decode step by batch size
    (`ExpertStats`).
    `sessions`: open sessions, pins (sessions and stored responses), pinned tokens, the
    pin budget and the pins released over it (`SessionManager.info`). `hicache` (None
    without ``--hicache-tier``): the second KV tier's capacity, usage and traffic
    (`HiRadixCache.tier_stats`; docs/hicache.md). `slo` (None without --slo-ttft-ms /
    --slo-tpot-ms): `slo_info`.
    Tensor parallelism: `tp_size` ranks; `kv_bytes_per_token`, `weights_bytes` and
    `kv_budget_bytes` are one rank's (each holds its own KV heads and weight shard),
    `kv_bytes_per_token_all_ranks` their sum, and `max_total_tokens` the group's token
    capacity (every rank holds its heads of every cached token)."""
    tp_size = runner.tp.size if runner.tp is not None else 1
    stats = scheduler.stats()
    return {
        "args": dataclasses.asdict(args),
        "resolved": {
            "device": runner.device,
            "attention_backend": type(runner.backend).__name__,
            "cpu_layout": runner.cpu_layout,
            "weight_format": runner.weight_format,
            "quantized_weights": runner.quantized_weights,
            "kv_cache_dtype": str(runner.kv_pool.dtype).removeprefix("torch."),
            "kv_scales": _kv_scales(runner),
            "omp_wait_policy": omp_policy.describe(),
        },
        "tp_size": tp_size,
        "kv_bytes_per_token": runner.kv_bytes_per_token,
        "kv_bytes_per_token_all_ranks": runner.kv_bytes_per_token * tp_size,
        "max_total_tokens": runner.max_total_tokens,
        "weights_bytes": runner.weights_bytes,
        "kv_budget_bytes": runner.kv_budget_bytes,
        "page_size": args.page_size,
        "context_length": runner.context_len,
        "memory": scheduler.memory_accounting(),
        "num_running": stats["num_running"],
        "num_waiting": stats["num_waiting"],
        "scheduler": stats,
        "sessions": scheduler.sessions.info(),
        "moe": runner.expert_stats.report(),
        "hicache": scheduler.tree.tier_stats() or None,
        "slo": slo_info(scheduler),
    }


def _kv_scales(runner: ModelRunner) -> dict[str, list[float]] | None:
    """An fp8 pool's per-layer K and V scales (None for other pools)."""
    scales = runner.kv_pool.kv_scales
    return None if scales is None else {"k": list(scales.k), "v": list(scales.v)}


def slo_info(scheduler: Scheduler) -> dict[str, Any] | None:
    """SLO scheduling (None when off): the targets, the fitted step-time model next to its
    prior (the planner's roofline fit, `--slo-step-prior`), and the goodput counters."""
    slo = scheduler.slo
    if slo is None:
        return None
    return {
        "ttft_ms": slo.ttft_ms,
        "tpot_ms": slo.tpot_ms,
        "admission": "reject" if slo.reject else "queue",
        "step_model": slo.model.describe(),
        **slo.stats(),
    }


def flush_cache(scheduler: Scheduler) -> tuple[bool, str]:
    """Drop every cached prefix and return its KV slots to the pool.

    Refused (False, reason) while requests run or wait: their matched prefixes are locked.
    Pins are released first (sessions stay open; their next turn is computed afresh).
    """
    busy = len(scheduler.running) + len(scheduler.waiting) + (scheduler.chunked is not None)
    if busy:
        return False, f"cannot flush the cache while {busy} requests are running or waiting"
    scheduler.pins.release_all()
    tree = scheduler.tree
    tree.evict(tree.evictable_size())
    tree.reset()
    return True, "cache flushed"
