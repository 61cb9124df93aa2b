"""Memory-side `radixlm plan` subcommands (kv, capacity): parsed args -> `Report`.

Each builder is a pure function of its argparse namespace (plus the model, GPU and
measured-CPU lookups) and returns a `Report`; `radixlm.plan.cli` prints it.
"""

from __future__ import annotations

import argparse

from radixlm.plan.capacity import capacity_table, weights_table
from radixlm.plan.dtypes import WEIGHT_DTYPES, normalize
from radixlm.plan.hardware import Hardware, derate, get_hardware
from radixlm.plan.hicache import idle_sessions, tier_bytes_per_token
from radixlm.plan.kv import (
    compare_models,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_heads_per_gpu,
    kv_replication,
    layout_variants,
)
from radixlm.plan.models import ModelSpec, load_model
from radixlm.plan.report import Report, Table, fmt_bytes, fmt_params

GIB = 1 << 30


def model_of(args: argparse.Namespace) -> ModelSpec:
    return load_model(args.model)


def _default_dtype(args: argparse.Namespace) -> str:
    """fp32 on the measured CPU (how radixlm runs there), bf16 on GPUs."""
    return "fp32" if str(getattr(args, "gpu", "")).lower() == "cpu" else "bf16"


def weight_dtype_of(args: argparse.Namespace) -> str:
    """--dtype, else a quantized checkpoint's own format (config.json), else the default."""
    quantized = None
    if args.dtype is None and getattr(args, "model", None):
        quantized = load_model(args.model).checkpoint_dtype
    return normalize(args.dtype or quantized or _default_dtype(args))


def kv_dtype_of(args: argparse.Namespace) -> str:
    return normalize(args.kv_dtype or _default_dtype(args))


def hardware_of(args: argparse.Namespace) -> Hardware:
    hw = get_hardware(args.gpu)
    return derate(hw, getattr(args, "flops_eff", 1.0), getattr(args, "bw_eff", 1.0))


def hw_facts(hw: Hardware, precision: str) -> list[tuple[str, str]]:
    bandwidth = f"{hw.mem_bandwidth / 1e9:,.1f} GB/s"
    if hw.copy_bandwidth:
        bandwidth += f" (GEMV weight streaming; copy {hw.copy_bandwidth / 1e9:,.1f} GB/s)"
    return [
        ("gpu", f"{hw.name} ({hw.source})"),
        ("memory", fmt_bytes(hw.memory_bytes)),
        ("bandwidth", bandwidth),
        (f"peak {precision}", f"{hw.flops(precision) / 1e12:,.3g} TFLOP/s"),
    ]


def model_facts(m: ModelSpec) -> list[tuple[str, str]]:
    if m.attention == "mla":
        attn = f"mla: {m.num_heads} heads, latent {m.kv_lora_rank} + rope key {m.qk_rope_head_dim}"
    else:
        attn = f"{m.attention}: {m.num_heads} query / {m.num_kv_heads} KV heads x {m.head_dim}"
    facts = [
        ("model", m.name),
        ("layers", str(m.num_layers)),
        ("attention", attn),
        ("parameters", fmt_params(m.total_params())),
    ]
    if m.is_moe:
        facts.append(("active parameters", fmt_params(m.active_params())))
    return facts


def cmd_kv(args: argparse.Namespace) -> Report:
    m = model_of(args)
    kv_dtype = kv_dtype_of(args)
    ctx = args.context
    per_token = kv_bytes_per_token(m, kv_dtype)
    dtypes = [d for d in ("fp32", "bf16", "fp8", "int8")]
    per_dtype = [
        {
            "kv_dtype": d,
            "bytes_per_token": kv_bytes_per_token(m, d),
            "bytes_per_sequence": kv_bytes_per_token(m, d) * ctx,
            "tokens_per_gib": GIB / kv_bytes_per_token(m, d),
        }
        for d in dtypes
    ]
    layouts = [vars(r) for r in layout_variants(m, kv_dtype)]
    tp_rows = [
        {
            "tp": tp,
            "kv_heads_per_gpu": kv_heads_per_gpu(m, tp),
            "replication": kv_replication(m, tp),
            "bytes_per_token_per_gpu": kv_bytes_per_token_per_gpu(m, kv_dtype, tp),
        }
        for tp in args.tp
    ]
    compare = []
    if args.compare:
        compare = compare_models([m, *[load_model(x) for x in args.compare]], kv_dtype, ctx)
    report = Report(
        "plan kv",
        {
            "model": m.name,
            "attention": m.attention,
            "kv_dtype": kv_dtype,
            "context": ctx,
            "bytes_per_token": per_token,
            "bytes_per_sequence": per_token * ctx,
            "per_dtype": per_dtype,
            "layouts": layouts,
            "tp": tp_rows,
            "compare": compare,
        },
        facts=[
            *model_facts(m),
            ("kv dtype", kv_dtype),
            ("KV bytes/token", f"{per_token:,.0f} B"),
            (f"KV per sequence @ {ctx:,}", fmt_bytes(per_token * ctx)),
        ],
    )
    report.tables.append(
        Table(
            f"By KV format (context {ctx:,})",
            ["kv dtype", "bytes/token", "per sequence", "tokens/GiB"],
            [
                [
                    r["kv_dtype"],
                    r["bytes_per_token"],
                    fmt_bytes(r["bytes_per_sequence"]),
                    int(r["tokens_per_gib"]),
                ]
                for r in per_dtype
            ],
        )
    )
    report.tables.append(
        Table(
            f"Attention layouts with this model's dimensions ({kv_dtype})",
            ["layout", "kv heads", "bytes/token", "x model"],
            [
                [r["layout"], r["kv_heads"] or "-", r["bytes_per_token"], r["ratio_to_model"]]
                for r in layouts
            ],
        )
    )
    report.tables.append(
        Table(
            "Per GPU under tensor parallelism",
            ["tp", "kv heads/GPU", "replication", "bytes/token/GPU"],
            [
                [r["tp"], r["kv_heads_per_gpu"], r["replication"], r["bytes_per_token_per_gpu"]]
                for r in tp_rows
            ],
        )
    )
    if compare:
        report.tables.append(
            Table(
                f"Compared ({kv_dtype}, context {ctx:,})",
                ["model", "attention", "bytes/token", "per sequence", "x first", "tokens/GiB"],
                [
                    [
                        r["model"],
                        r["attention"],
                        r["bytes_per_token"],
                        fmt_bytes(r["bytes_per_sequence"]),
                        r["ratio_to_first"],
                        int(r["tokens_per_gib"]),
                    ]
                    for r in compare
                ],
            )
        )
        first = compare[0]
        for r in compare[1:]:
            more = r["bytes_per_token"] / first["bytes_per_token"]
            report.notes.append(
                f"{first['model']} holds {more:.2f}x the tokens of {r['model']} per byte "
                "of KV memory"
            )
    if m.attention == "mla":
        report.notes.append(
            "MLA caches one latent (kv_lora_rank) and one RoPE key per "
            "layer, shared by all heads (DeepSeek-V2 section 2.1)"
        )
    return report


def cmd_capacity(args: argparse.Namespace) -> Report:
    m = model_of(args)
    hw = None if args.kv_budget_bytes is not None else hardware_of(args)
    rows = capacity_table(
        m,
        hw,
        tuple(args.tp),
        weight_dtype=weight_dtype_of(args),
        kv_dtype=kv_dtype_of(args),
        context=args.context,
        mem_fraction=args.mem_fraction,
        reserve_bytes=args.reserve_gib * GIB,
        kv_budget_bytes=args.kv_budget_bytes,
        page_size=args.page_size,
        group_size=args.group_size,
    )
    weights = weights_table(m, WEIGHT_DTYPES, args.group_size)
    data = {
        "model": m.name,
        "gpu": hw.name if hw else None,
        "weight_dtype": weight_dtype_of(args),
        "kv_dtype": kv_dtype_of(args),
        "context": args.context,
        "page_size": args.page_size,
        "mem_fraction": args.mem_fraction,
        "weights": weights,
        "rows": [r.to_dict() for r in rows],
    }
    facts = model_facts(m)
    if hw:
        facts += hw_facts(hw, "bf16")[:2]
        facts.append(
            (
                "budget",
                f"memory x {args.mem_fraction} - weights/tp - {args.reserve_gib} GiB reserve",
            )
        )
    else:
        facts.append(("budget", f"{args.kv_budget_bytes:,} B of KV per GPU (given)"))
    report = Report("plan capacity", data, facts=facts)
    report.tables.append(
        Table(
            "Weights (fp8, int8, int4: block linears quantized, embeddings, head, norms "
            "16-bit; q8_0, q4_1: GGUF blocks, embedding and head Q8_0, norms fp32)",
            ["dtype", "bytes", "x bf16"],
            [[w["dtype"], fmt_bytes(w["bytes"]), w["ratio_to_bf16"]] for w in weights],
        )
    )
    report.tables.append(
        Table(
            f"Capacity ({weight_dtype_of(args)} weights, {kv_dtype_of(args)} KV, "
            f"context {args.context:,})",
            [
                "tp",
                "weights/GPU",
                "KV budget/GPU",
                "KV B/token/GPU",
                "replication",
                "tokens",
                "tokens if no repl.",
                "users",
            ],
            [
                [
                    r.tp,
                    fmt_bytes(r.weights_bytes_per_gpu),
                    fmt_bytes(r.kv_budget_bytes_per_gpu),
                    r.kv_bytes_per_token_per_gpu,
                    r.kv_replication,
                    r.max_tokens,
                    r.tokens_without_replication,
                    r.max_users,
                ]
                for r in rows
            ],
        )
    )
    if args.hicache_bytes:
        _idle_sessions(args, m, kv_dtype_of(args), rows, data, report)
    for r in rows:
        if r.kv_budget_bytes_per_gpu <= 0:
            report.notes.append(f"tp={r.tp}: the weights alone exceed the memory budget")
        elif r.kv_replication > 1:
            what = "the MLA latent is" if m.attention == "mla" else "KV heads are"
            report.notes.append(
                f"tp={r.tp}: {what} replicated {r.kv_replication:g}x, so capacity is "
                f"{r.max_tokens:,} tokens instead of {r.tokens_without_replication:,}"
            )
    return report


def _idle_sessions(
    args: argparse.Namespace, m, kv_dtype: str, rows, data: dict, report: Report
) -> None:
    """The idle-sessions table of `capacity --hicache-bytes` (`radixlm.plan.hicache`)."""
    history = args.session_history or args.context
    fmt = args.hicache_tier_format
    idle = [
        idle_sessions(
            r.max_tokens,
            int(args.hicache_bytes // tier_bytes_per_token(m, kv_dtype, r.tp, fmt)),
            history,
            args.page_size,
            args.hicache_write_policy,
        )
        for r in rows
    ]
    data["idle_sessions"] = [{"tp": r.tp, **i.to_dict()} for r, i in zip(rows, idle)]
    report.tables.append(
        Table(
            f"Idle sessions of {history:,} tokens ({fmt_bytes(args.hicache_bytes)} second "
            f"tier per GPU, {fmt} rows, {args.hicache_write_policy})",
            ["tp", "pool tokens", "tier tokens", "in pool", "in tier", "held"],
            [
                [
                    r.tp,
                    i.primary_tokens,
                    i.tier_tokens,
                    i.primary_sessions,
                    i.tier_sessions,
                    i.held_sessions,
                ]
                for r, i in zip(rows, idle)
            ],
        )
    )
