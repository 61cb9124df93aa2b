"""`radixlm plan moe`: parsed args -> `Report`.

The model is `--model` (preset, radixlm alias or config.json), or its sparse layers given
by --num-experts, --top-k, --hidden and --moe-intermediate (with --layers and
--shared-intermediate); the formulas are in `radixlm.plan.moe`.
"""

from __future__ import annotations

import argparse

from radixlm.plan.commands_memory import model_facts, weight_dtype_of
from radixlm.plan.models import load_model
from radixlm.plan.moe import ExpertLayout, expert_traffic, moe_batch_table, moe_bills
from radixlm.plan.report import Report, Table, fmt_bytes, fmt_params

#: The flags that give the sparse layers without a model, by argparse dest.
SHAPE_FLAGS = ("num_experts", "top_k", "hidden", "moe_intermediate")
_OPTIONAL_SHAPE = ("layers", "shared_intermediate")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def layout_of(args: argparse.Namespace) -> ExpertLayout:
    """The flags' `ExpertLayout`. Raises ValueError when one of the four is missing."""
    missing = [_flag(d) for d in SHAPE_FLAGS if getattr(args, d) is None]
    if missing:
        raise ValueError(f"give --model, or all of {', '.join(map(_flag, SHAPE_FLAGS))} "
                         f"(missing {', '.join(missing)})")  # fmt: skip
    return ExpertLayout(
        num_experts=args.num_experts,
        top_k=args.top_k,
        hidden=args.hidden,
        intermediate=args.moe_intermediate,
        layers=args.layers if args.layers is not None else 1,
        shared_intermediate=args.shared_intermediate or 0,
    )


def traffic_table(rows: list[dict]) -> Table:
    return Table(
        "Feed-forward weights read per decode step (sparse layers, uniform top-k routing)",
        ["batch", "experts/layer", "active", "MoE", "dense same active", "dense same total",
         "MoE/active"],
        [
            [
                r["batch"],
                r["distinct_experts"],
                f"{100 * r['active_fraction']:.1f}%",
                fmt_bytes(r["moe_bytes"]),
                fmt_bytes(r["dense_same_active_bytes"]),
                fmt_bytes(r["dense_same_total_bytes"]),
                f"{r['moe_over_dense_active']:.2f}x",
            ]
            for r in rows
        ],
    )  # fmt: skip


def _layout_facts(layout: ExpertLayout) -> list[tuple[str, str]]:
    shared = f", shared expert of width {layout.shared_intermediate}"
    return [
        (
            "experts",
            f"{layout.num_experts} routed, top-{layout.top_k}, width {layout.intermediate}"
            + (shared if layout.shared_intermediate else ""),
        ),
        ("sparse layers", str(layout.layers)),
        ("parameters per expert", fmt_params(layout.expert_params)),
    ]


def cmd_moe(args: argparse.Namespace) -> Report:
    """The MoE report of `--model`, or the expert-traffic report of the shape flags.
    Raises ValueError when both or neither are given."""
    given = [_flag(d) for d in SHAPE_FLAGS + _OPTIONAL_SHAPE if getattr(args, d) is not None]
    dtype = weight_dtype_of(args)
    if args.model is None:
        layout = layout_of(args)
        rows = expert_traffic(layout, tuple(args.batches), dtype)
        data = {"model": None, "is_moe": True, "dtype": dtype, **vars(layout)}
        report = Report("plan moe", {**data, "experts_per_step": rows}, _layout_facts(layout))
        report.tables.append(traffic_table(rows))
        return report
    if given:
        raise ValueError(f"--model excludes {', '.join(given)}")
    m = load_model(args.model)
    if not m.is_moe:
        return Report(
            "plan moe",
            {"model": m.name, "is_moe": False},
            facts=model_facts(m),
            notes=[f"{m.name} is dense: memory and bandwidth bills are both the total parameters"],
        )
    bills = moe_bills(m, dtype)
    rows = moe_batch_table(m, tuple(args.batches), dtype)
    layout = ExpertLayout.of(m)
    traffic = expert_traffic(layout, tuple(args.batches), dtype)
    report = Report(
        "plan moe",
        {"model": m.name, "is_moe": True, "dtype": dtype, **bills, "rows": rows,
         "experts_per_step": traffic},
        facts=[
            *model_facts(m),
            *_layout_facts(layout),
            ("memory bill", f"{fmt_bytes(bills['memory_bytes'])} (all parameters, {dtype})"),
            (
                "bandwidth bill",
                f"{fmt_bytes(bills['bandwidth_bytes_per_token_batch1'])}"
                " per token at batch 1 (active parameters)",
            ),
            ("memory / bandwidth", f"{bills['memory_to_bandwidth_ratio']:.2f}x"),
            (
                "all experts active",
                f"from {bills['batch_all_experts_active']} tokens/step (< 1 expected idle expert)",
            ),
            (
                "50/90/99% active",
                f"{bills['batch_50pct_active']} / "
                f"{bills['batch_90pct_active']} / "
                f"{bills['batch_99pct_active']} tokens/step",
            ),
        ],
    )  # fmt: skip
    report.tables.append(
        Table(
            "Weights read per decode step (uniform top-k routing)",
            ["batch", "experts/layer", "active", "read/step", "read/token", "expert FLOP/B"],
            [
                [
                    r["batch"],
                    r["active_experts"],
                    f"{100 * r['active_fraction']:.1f}%",
                    fmt_bytes(r["weights_read_bytes"]),
                    fmt_bytes(r["weights_read_per_token"]),
                    r["expert_intensity"],
                ]
                for r in rows
            ],
        )
    )
    report.tables.append(traffic_table(traffic))
    return report
