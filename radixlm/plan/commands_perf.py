"""Time-side `radixlm plan` subcommands (roofline, spec, chunk, disagg, fleet): args -> Report."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from radixlm.plan.chunk import plan_chunk, steps_for_prompt
from radixlm.plan.commands_memory import (
    hardware_of,
    hw_facts,
    kv_dtype_of,
    model_facts,
    model_of,
    weight_dtype_of,
)
from radixlm.plan.cost import Deployment
from radixlm.plan.disagg import plan_disagg
from radixlm.plan.dtypes import compute_precision
from radixlm.plan.fleet import plan_fleet
from radixlm.plan.lengths import LengthDist
from radixlm.plan.models import load_model
from radixlm.plan.report import Report, Table, fmt_bytes
from radixlm.plan.roofline import (
    decode_curve,
    decode_knee,
    knee_closed_form,
    plot_roofline,
    prefill_points,
    ridge_point,
)
from radixlm.plan.spec import SpecModel, best_draft_len, expected_tokens, leviathan_speedup


def deployment_of(args: argparse.Namespace, tp: int | None = None, model=None) -> Deployment:
    return Deployment(
        model=model or model_of(args),
        hw=hardware_of(args),
        weight_dtype=weight_dtype_of(args),
        kv_dtype=kv_dtype_of(args),
        tp=tp or args.tp,
        overhead_s=args.overhead_ms / 1e3,
    )


def dep_facts(dep: Deployment) -> list[tuple[str, str]]:
    precision = compute_precision(dep.weight_dtype)
    return [
        *model_facts(dep.model),
        *hw_facts(dep.hw, precision),
        (
            "replica",
            f"tp={dep.tp}, weights {dep.weight_dtype}, KV {dep.kv_dtype}, "
            f"overhead {dep.overhead_s * 1e3:g} ms/step",
        ),
    ]


def cmd_roofline(args: argparse.Namespace) -> Report:
    dep = deployment_of(args)
    ctx = args.context
    curve = decode_curve(dep, ctx, tuple(args.batches))
    prefill = prefill_points(dep, tuple(args.prompts))
    ridge = ridge_point(dep)
    knee = decode_knee(dep, ctx)
    closed = knee_closed_form(dep, ctx) if not dep.model.is_moe else None
    data = {
        "model": dep.model.name,
        "gpu": dep.hw.name,
        "tp": dep.tp,
        "context": ctx,
        "ridge_flop_per_byte": ridge,
        "knee_batch": knee,
        "knee_closed_form": closed,
        "peak_flops": dep.peak_flops,
        "mem_bandwidth": dep.hw.mem_bandwidth,
        "decode": [asdict(p) for p in curve],
        "prefill": prefill,
    }
    facts = [
        *dep_facts(dep),
        ("ridge point", f"{ridge:,.1f} FLOP/byte"),
        (
            "decode knee",
            f"batch {knee:,}"
            if knee
            else "none: decode stays memory-bound (KV reads dominate at this context)",
        ),
    ]
    if closed is not None:
        facts.append(("knee (closed form)", f"{closed:,.1f}"))
    weights_knee = decode_knee(dep, 0)
    data["knee_batch_weights_only"] = weights_knee
    facts.append(("knee without KV reads", f"batch {weights_knee:,}" if weights_knee else "none"))
    report = Report("plan roofline", data, facts=facts)
    report.tables.append(
        Table(
            f"Decode step, context {ctx:,} per sequence",
            ["batch", "FLOP/byte", "compute ms", "memory ms", "step ms", "tokens/s", "bound"],
            [
                [
                    p.batch,
                    p.intensity,
                    p.compute_ms,
                    p.memory_ms,
                    p.step_ms,
                    p.tokens_per_s,
                    p.bound,
                ]
                for p in curve
            ],
        )
    )
    report.tables.append(
        Table(
            "Prefill of one prompt (one step)",
            ["prompt", "FLOP/byte", "step ms", "tokens/s", "bound"],
            [
                [p["prompt"], p["intensity"], p["step_ms"], p["tokens_per_s"], p["bound"]]
                for p in prefill
            ],
        )
    )
    if args.plot:
        try:
            data["plot"] = plot_roofline(dep, ctx, curve, prefill, args.plot, knee)
            report.notes.append(f"plot written to {args.plot}")
        except ImportError:
            report.notes.append("--plot needs matplotlib (pip install matplotlib); skipped")
    return report


def cmd_spec(args: argparse.Namespace) -> Report:
    dep = deployment_of(args)
    a, k, c = args.acceptance, args.draft_len, args.draft_cost
    draft = deployment_of(args, model=load_model(args.draft_model)) if args.draft_model else None
    sm = SpecModel(dep, a, k, args.context, draft_cost=c, draft=draft)
    points = [sm.point(b) for b in args.batches]
    even = sm.break_even_batch()
    best_k = best_draft_len(a, c)
    sweep = [
        {
            "draft_len": kk,
            "expected_tokens": expected_tokens(a, kk),
            "speedup_batch1": leviathan_speedup(a, kk, c),
        }
        for kk in range(1, 9)
    ]
    data = {
        "model": dep.model.name,
        "gpu": dep.hw.name,
        "acceptance": a,
        "draft_len": k,
        "draft_cost": None if draft else c,
        "draft_model": args.draft_model,
        "expected_tokens": expected_tokens(a, k),
        "leviathan_speedup": leviathan_speedup(a, k, c),
        "best_draft_len": best_k,
        "break_even_batch": even,
        "points": [asdict(p) for p in points],
        "draft_len_sweep": sweep,
    }
    draft_desc = f"model {args.draft_model} (roofline-priced)" if draft else f"cost {c:g}"
    report = Report(
        "plan spec",
        data,
        facts=[
            *dep_facts(dep),
            ("speculation", f"acceptance {a:g}, draft length {k}, draft {draft_desc}"),
            ("tokens/step", f"{expected_tokens(a, k):.3f} = (1 - a^(k+1)) / (1 - a)"),
            (
                "speed-up batch 1",
                f"{leviathan_speedup(a, k, c):.3f}x (Leviathan, verify = 1 decode step)",
            ),
            ("best draft length", f"{best_k} (batch 1, cost {c:g})"),
            ("stops paying at", f"batch {even:,}" if even else "not within 65,536"),
        ],
    )
    report.tables.append(
        Table(
            f"Batch-aware speed-up (context {args.context:,})",
            ["batch", "decode ms", "draft ms", "verify ms", "tokens/step", "speed-up"],
            [
                [p.batch, p.decode_ms, p.draft_ms, p.verify_ms, p.tokens_per_step, p.speedup]
                for p in points
            ],
        )
    )
    report.tables.append(
        Table(
            "Draft length sweep (batch 1)",
            ["k", "tokens/step", "speed-up"],
            [[r["draft_len"], r["expected_tokens"], r["speedup_batch1"]] for r in sweep],
        )
    )
    return report


def cmd_chunk(args: argparse.Namespace) -> Report:
    dep = deployment_of(args)
    plan = plan_chunk(
        dep,
        decode_batch=args.decode_batch,
        context=args.context,
        prompt=args.prompt,
        tpot_slo_ms=args.tpot_ms,
        ttft_slo_ms=args.ttft_ms,
        align=args.align,
    )
    facts = [
        *dep_facts(dep),
        (
            "workload",
            f"{plan.decode_batch} decodes at context {plan.context:,}; "
            f"new prompt {plan.prompt:,} tokens",
        ),
        ("SLOs", f"TPOT <= {plan.tpot_slo_ms:g} ms, TTFT <= {plan.ttft_slo_ms:g} ms"),
        ("decode-only step", f"{plan.decode_only_ms:.2f} ms"),
        ("unchunked step", f"{plan.whole_prompt_ms:.2f} ms (whole prompt + decodes)"),
        ("max chunk (TPOT)", str(plan.max_chunk)),
        ("min chunk (TTFT)", str(plan.min_chunk) if plan.min_chunk else "none"),
    ]
    if plan.recommended_chunk:
        facts += [
            (
                "chunk size",
                f"{plan.recommended_chunk:,} tokens "
                f"({steps_for_prompt(plan.prompt, plan.recommended_chunk)} step(s))",
            ),
            ("token budget/step", f"{plan.token_budget:,} (decodes + chunk)"),
            ("worst ITL", f"{plan.itl_ms:.2f} ms"),
            ("TTFT", f"{plan.ttft_ms:.1f} ms"),
        ]
    facts.append(("verdict", ("ok: " if plan.feasible else "infeasible: ") + plan.reason))
    return Report(
        "plan chunk",
        {"model": dep.model.name, "gpu": dep.hw.name, "tp": dep.tp, **asdict(plan)},
        facts=facts,
    )


def cmd_disagg(args: argparse.Namespace) -> Report:
    dep = deployment_of(args)
    link = args.link_gbps * 1e9 / 8
    p = plan_disagg(
        dep,
        prompt=args.prompt,
        output=args.output,
        link_bandwidth=link,
        tpot_slo_ms=args.tpot_ms,
        colocated_batch=args.colocated_batch,
        link_latency_s=args.link_latency_ms / 1e3,
        mem_fraction=args.mem_fraction,
    )
    ratio = p.prefill_to_decode_ratio
    facts = [
        *dep_facts(dep),
        ("request", f"prompt {p.prompt:,}, output {p.output:,} tokens"),
        (
            "KV to transfer",
            f"{fmt_bytes(p.kv_bytes_per_request)} per request "
            f"({fmt_bytes(p.kv_bytes_per_gpu)} per GPU)",
        ),
        ("link", f"{args.link_gbps:g} Gbit/s per GPU"),
        ("transfer time", f"{p.transfer_ms:.2f} ms"),
        ("prefill time", f"{p.prefill_ms:.2f} ms"),
        (
            "break-even link",
            f"{p.break_even_bandwidth * 8 / 1e9:,.1f} Gbit/s per GPU (transfer = prefill time)",
        ),
        (
            "colocated stall",
            f"{p.stall_ms:.2f} ms on each of {p.colocated_decode_batch} "
            f"decodes (step {p.decode_ms:.2f} -> {p.mixed_step_ms:.2f} ms)",
        ),
        (
            "colocated meets TPOT",
            "yes" if p.colocated_meets_tpot else f"no (unchunked step > {p.tpot_slo_ms:g} ms)",
        ),
        (
            "transfer hidden",
            "yes"
            if p.transfer_hidden_by_prefill
            else "no: the link is slower than prefill produces KV",
        ),
        (
            "disagg pays (latency)",
            "yes: transfer < stall" if p.disagg_pays_on_latency else "no: transfer >= stall",
        ),
        (
            "decode instance",
            f"batch {p.decode_batch} ({p.decode_limit}-limited), step "
            f"{p.decode_step_ms:.2f} ms, {p.decode_rps_per_instance:.3f} req/s",
        ),
        ("prefill instance", f"{p.prefill_rps_per_instance:.3f} req/s"),
        ("prefill : decode", _ratio_text(ratio)),
    ]
    return Report(
        "plan disagg",
        {"model": dep.model.name, "gpu": dep.hw.name, "tp": dep.tp, **p.to_dict()},
        facts=facts,
    )


def _ratio_text(ratio: float) -> str:
    """N_prefill / N_decode as "a : b" with the smaller side 1."""
    if not ratio or ratio == float("inf"):
        return "decode infeasible"
    text = f"{ratio:.2f} : 1" if ratio >= 1 else f"1 : {1 / ratio:.2f}"
    return f"{text} instances (N_prefill / N_decode = {ratio:.3f})"


def cmd_fleet(args: argparse.Namespace) -> Report:
    model = model_of(args)
    deps = [deployment_of(args, tp=tp, model=model) for tp in args.tp]
    prompt, output = LengthDist.parse(args.prompt_len), LengthDist.parse(args.output_len)
    best, plans = plan_fleet(
        deps,
        rate=args.rate,
        prompt=prompt,
        output=output,
        ttft_slo_ms=args.ttft_ms,
        tpot_slo_ms=args.tpot_ms,
        utilization=args.utilization,
        gpus_per_node=args.gpus_per_node,
        prefix_hit=args.prefix_hit,
        mem_fraction=args.mem_fraction,
    )
    data = {
        "model": model.name,
        "gpu": deps[0].hw.name,
        "rate": args.rate,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "ttft_slo_ms": args.ttft_ms,
        "tpot_slo_ms": args.tpot_ms,
        "best": asdict(best) if best else None,
        "plans": [asdict(p) for p in plans],
    }
    facts = [
        *dep_facts(deps[0])[:-1],
        (
            "target",
            f"{args.rate:,g} req/s, prompt {args.prompt_len}, output "
            f"{args.output_len}, TTFT <= {args.ttft_ms:g} ms, "
            f"TPOT <= {args.tpot_ms:g} ms",
        ),
    ]
    if best:
        facts.append(
            (
                "answer",
                f"{best.replicas:,} replicas x tp={best.tp} = "
                f"{best.gpus:,} GPUs on {best.nodes:,} nodes",
            )
        )
    else:
        facts.append(("answer", "no TP degree meets the SLOs; see the reasons below"))
    report = Report("plan fleet", data, facts=facts)
    if best:
        report.tables.append(
            Table(
                f"Sizing chain (tp={best.tp})",
                ["step", "formula", "value"],
                [[c["step"], c["formula"], c["value"]] for c in best.chain],
            )
        )
    report.tables.append(
        Table(
            "By tensor-parallel degree",
            [
                "tp",
                "feasible",
                "batch",
                "req/s/replica",
                "TPOT ms",
                "TTFT ms",
                "replicas",
                "GPUs",
                "nodes",
                "note",
            ],
            [
                [
                    p.tp,
                    p.feasible,
                    p.decode_batch,
                    p.replica_rps,
                    p.tpot_ms,
                    p.ttft_ms,
                    p.replicas,
                    p.gpus,
                    p.nodes,
                    p.reason,
                ]
                for p in plans
            ],
        )
    )
    return report
