"""`radixlm plan`: argument parsing and dispatch for the planner subcommands.

The top-level CLI calls `register(subparsers)`; `python -m radixlm.plan` calls `main`.
Every subcommand prints a table report, or JSON with ``--json``, and returns 0. Bad
input prints one error line on stderr and exits with status 2: a malformed or
out-of-range flag is rejected by argparse (the `radixlm.plan.validate` types name the
flag and its allowed range); an unknown model or GPU, or a ValueError from the pure
functions, is reported by the subcommand's runner, which returns 2.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Callable

from radixlm.errors import ModelNotFoundError
from radixlm.plan import commands_memory as mem
from radixlm.plan import commands_moe
from radixlm.plan import commands_perf as perf
from radixlm.plan.dtypes import KV_DTYPES, WEIGHT_DTYPES, normalize
from radixlm.plan.hardware import gpu_names
from radixlm.plan.models import preset_names
from radixlm.plan.report import Report, render_json, render_text
from radixlm.plan.validate import (
    HelpFormatter,
    OneLineParser,
    fraction,
    int_list,
    length_dist,
    non_negative_float,
    non_negative_int,
    one_line,
    positive_float,
    positive_int,
    probability,
)


def _common(
    p: argparse.ArgumentParser, gpu: bool = True, tp_list: bool = False, model_required: bool = True
) -> None:
    p.add_argument(
        "--model",
        required=model_required,
        help=f"preset ({', '.join(preset_names())}), radixlm alias "
        "(e.g. smollm2-135m) or path to a config.json",
    )
    if gpu:
        p.add_argument(
            "--gpu",
            default="H100-SXM",
            help=f"accelerator: {', '.join(gpu_names())} (cpu is measured on the spot)",
        )
        p.add_argument(
            "--flops-eff",
            type=fraction,
            default=1.0,
            help="achievable fraction of peak FLOP/s, in (0, 1]; 1.0 = datasheet roofline",
        )
        p.add_argument(
            "--bw-eff",
            type=fraction,
            default=1.0,
            help="achievable fraction of peak memory bandwidth, in (0, 1]",
        )
        p.add_argument(
            "--overhead-ms",
            type=non_negative_float,
            default=0.0,
            help="fixed cost added to every forward step, ms (>= 0)",
        )
        p.add_argument(
            "--mem-fraction",
            type=fraction,
            default=0.9,
            help="share of device memory for weights + KV, in (0, 1]",
        )
    on_cpu = "; fp32 with --gpu cpu" if gpu else ""
    p.add_argument(
        "--dtype",
        default=None,
        choices=WEIGHT_DTYPES,
        help=f"weight format (default: bf16{on_cpu})",
    )
    p.add_argument(
        "--kv-dtype",
        default=None,
        type=normalize,
        choices=KV_DTYPES,
        help=f"KV-cache format; radixlm's --kv-cache-dtype names (float16, fp8_e4m3, "
        f"fp8_e5m2, ...) are taken as theirs (default: bf16{on_cpu})",
    )
    if tp_list:
        p.add_argument(
            "--tp",
            type=int_list,
            default="1,2,4,8",
            help="tensor-parallel degrees, comma-separated integers >= 1",
        )
    else:
        p.add_argument(
            "--tp",
            type=positive_int,
            default=1,
            help="tensor-parallel degree, integer >= 1 (usually a power of two)",
        )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _slo(p: argparse.ArgumentParser, tpot: bool = True, ttft: bool = True) -> None:
    if ttft:
        p.add_argument(
            "--ttft-ms",
            type=positive_float,
            default=2000.0,
            help="time-to-first-token SLO, ms (> 0)",
        )
    if tpot:
        p.add_argument(
            "--tpot-ms",
            type=positive_float,
            default=50.0,
            help="time-per-output-token SLO, ms (> 0)",
        )


def _add(
    sub, name: str, help_text: str, builder: Callable[[argparse.Namespace], Report], **common
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
    _common(p, **common)
    p.set_defaults(func=_runner(builder, p.prog))
    return p


def _runner(
    builder: Callable[[argparse.Namespace], Report], prog: str
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            report = builder(args)
        except (ModelNotFoundError, ValueError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
            return 2
        sys.stdout.write(render_json(report) if args.json else render_text(report))
        return 0

    return run


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `plan` command and its subcommands to an argparse subparsers object."""
    plan = subparsers.add_parser(
        "plan",
        help="size a deployment: KV, capacity, roofline, speculation, chunking, "
        "disaggregation, fleet, MoE",
        description="Analytic serving planner. Every formula is documented with its "
        "derivation and source in radixlm/plan/.",
    )
    plan.error = types.MethodType(OneLineParser.error, plan)  # one-line errors here too
    plan.set_defaults(func=lambda args: (plan.print_help(), 2)[1])
    sub = plan.add_subparsers(dest="plan_command", metavar="SUBCOMMAND", parser_class=OneLineParser)

    p = _add(
        sub,
        "kv",
        "KV-cache bytes per token and per sequence, by layout and format",
        mem.cmd_kv,
        gpu=False,
        tp_list=True,
    )
    p.add_argument("--context", type=positive_int, default=8192, help="tokens per sequence")
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="MODEL",
        help="other models (preset, alias or config.json) to compare KV size against",
    )

    p = _add(
        sub,
        "capacity",
        "weights, KV budget, tokens and users that fit, per TP degree",
        mem.cmd_capacity,
        tp_list=True,
    )
    p.add_argument(
        "--context", type=positive_int, default=8192, help="tokens per user (sequence length)"
    )
    p.add_argument(
        "--reserve-gib",
        type=non_negative_float,
        default=0.0,
        help="extra memory reserved per GPU, GiB (>= 0)",
    )
    p.add_argument(
        "--kv-budget-bytes",
        type=non_negative_int,
        default=None,
        help="KV bytes per GPU, integer >= 0 (overrides the budget derived from --gpu)",
    )
    p.add_argument(
        "--page-size",
        type=positive_int,
        default=1,
        help="KV page size, tokens (>= 1); capacity rounds down to whole pages",
    )
    p.add_argument(
        "--group-size",
        type=positive_int,
        default=128,
        help="int4 quantization group, weights per fp16 scale + zero point (>= 1)",
    )
    p.add_argument(
        "--hicache-bytes",
        type=non_negative_int,
        default=0,
        help="second KV tier bytes per GPU (host memory or disk, --hicache-tier), integer "
        ">= 0; with it the report counts the idle sessions both tiers hold",
    )
    p.add_argument(
        "--hicache-tier-format",
        choices=["raw", "fp8", "int8"],
        default="raw",
        help="how the second tier stores a row: raw as the pool does (--hicache-tier host or "
        "disk), or 8-bit values with a float32 scale per head row (fp8, int8)",
    )
    p.add_argument(
        "--session-history",
        type=positive_int,
        default=None,
        help="tokens of one idle session's history (default: --context)",
    )
    p.add_argument(
        "--hicache-write-policy",
        choices=["write_through", "write_back"],
        default="write_through",
        help="the tier's write policy: write_through copies every session (the pool's "
        "sessions are among the tier's), write_back only the evicted ones",
    )

    p = _add(
        sub, "roofline", "arithmetic intensity, ridge, decode knee, step times", perf.cmd_roofline
    )
    p.add_argument(
        "--context",
        type=non_negative_int,
        default=1024,
        help="cached tokens per decoding sequence",
    )
    p.add_argument(
        "--batches",
        type=int_list,
        default="1,2,4,8,16,32,64,128,256,512,1024",
        help="decode batch sizes, comma-separated integers >= 1",
    )
    p.add_argument(
        "--prompts",
        type=int_list,
        default="128,512,2048,8192",
        help="prompt lengths for the prefill rows, tokens, comma-separated",
    )
    p.add_argument("--plot", metavar="PNG", help="write a plot to this path (needs matplotlib)")

    p = _add(sub, "spec", "speculative decoding speed-up and break-even batch", perf.cmd_spec)
    p.add_argument(
        "--acceptance",
        type=probability,
        default=0.7,
        help="per-token acceptance rate a, in [0, 1]",
    )
    p.add_argument(
        "--draft-len", type=positive_int, default=4, help="draft tokens per step k (>= 1)"
    )
    p.add_argument(
        "--draft-cost",
        type=non_negative_float,
        default=0.05,
        help="draft step time / target decode step time c (>= 0; ~0 for n-gram drafts)",
    )
    p.add_argument(
        "--draft-model",
        help="price the draft as this model on the same GPUs (overrides --draft-cost)",
    )
    p.add_argument(
        "--context", type=non_negative_int, default=1024, help="cached tokens per sequence"
    )
    p.add_argument(
        "--batches",
        type=int_list,
        default="1,4,16,64,256,1024",
        help="batch sizes, comma-separated integers >= 1",
    )

    p = _add(sub, "chunk", "chunked-prefill budget under TPOT and TTFT SLOs", perf.cmd_chunk)
    p.add_argument(
        "--decode-batch",
        type=non_negative_int,
        default=32,
        help="running decode requests (>= 0)",
    )
    p.add_argument(
        "--context",
        type=non_negative_int,
        default=2048,
        help="cached tokens of each running decode",
    )
    p.add_argument(
        "--prompt", type=positive_int, default=4096, help="new prompt length, tokens (>= 1)"
    )
    _slo(p)
    p.add_argument(
        "--align", type=positive_int, default=64, help="chunk size granularity, tokens (>= 1)"
    )

    p = _add(
        sub, "disagg", "prefill/decode disaggregation break-even and pool ratio", perf.cmd_disagg
    )
    p.add_argument("--prompt", type=positive_int, default=4096, help="prompt length, tokens (>= 1)")
    p.add_argument("--output", type=positive_int, default=256, help="output length, tokens (>= 1)")
    p.add_argument(
        "--link-gbps",
        type=positive_float,
        default=400.0,
        help="KV transfer bandwidth per GPU, Gbit/s (> 0; 400 = one NDR NIC)",
    )
    p.add_argument(
        "--link-latency-ms",
        type=non_negative_float,
        default=0.0,
        help="fixed latency of one KV transfer, ms (>= 0)",
    )
    _slo(p, ttft=False)
    p.add_argument(
        "--colocated-batch",
        type=non_negative_int,
        default=32,
        help="running decodes a colocated prefill would interrupt (>= 0)",
    )

    p = _add(
        sub,
        "fleet",
        "replicas and nodes for a request rate and SLO pair",
        perf.cmd_fleet,
        tp_list=True,
    )
    p.add_argument(
        "--rate", type=positive_float, default=10000.0, help="target requests per second (> 0)"
    )
    p.add_argument(
        "--prompt-len",
        type=length_dist,
        default="1024",
        help='prompt length in tokens, or a distribution "len:weight,..." (e.g. 128:1,2048:1)',
    )
    p.add_argument(
        "--output-len",
        type=length_dist,
        default="256",
        help='output length in tokens, or a distribution "len:weight,..."',
    )
    _slo(p)
    p.add_argument(
        "--utilization",
        type=fraction,
        default=0.8,
        help="target load of each replica, in (0, 1]; below 1 keeps queueing delay bounded",
    )
    p.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs per node (>= 1)")
    p.add_argument(
        "--prefix-hit",
        type=probability,
        default=0.0,
        help="fraction of prompt tokens served from the prefix cache, in [0, 1]",
    )

    p = _add(
        sub,
        "moe",
        "MoE memory bill vs bandwidth bill, distinct experts and expert bytes per decode step "
        "against dense models of the same active and total parameters",
        commands_moe.cmd_moe,
        gpu=False,
        model_required=False,
    )
    p.add_argument(
        "--batches",
        type=int_list,
        default="1,2,4,8,16,32,64,128,256,512,1024",
        help="decode batch sizes (tokens per step), comma-separated integers >= 1",
    )
    shape = p.add_argument_group(
        "sparse layers without --model", "all four of the first flags replace --model"
    )
    shape.add_argument("--num-experts", type=positive_int, help="routed experts per layer E")
    shape.add_argument("--top-k", type=positive_int, help="experts per token k (<= E)")
    shape.add_argument("--hidden", type=positive_int, help="model width H")
    shape.add_argument(
        "--moe-intermediate", type=positive_int, help="width I of one routed expert's SwiGLU"
    )
    shape.add_argument(
        "--layers", type=positive_int, default=None, help="sparse layers (default 1)"
    )
    shape.add_argument(
        "--shared-intermediate",
        type=non_negative_int,
        default=None,
        help="width of a shared expert every token runs (default 0: none)",
    )
    return plan


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="radixlm")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m radixlm.plan ...` (arguments after `plan`)."""
    args = build_parser().parse_args(["plan", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
