"""`radixlm plan`: argument parsing and dispatch for the planner subcommands.

The top-level CLI calls `register(subparsers)`; `python -m radixlm.plan` calls `main`.
Every subcommand prints a table report, or JSON with ``--json``, and returns 0; bad
input (unknown model or GPU, malformed numbers) prints one error line and returns 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from radixlm.errors import ModelNotFoundError
from radixlm.plan import commands_memory as mem
from radixlm.plan import commands_perf as perf
from radixlm.plan.dtypes import KV_DTYPES, WEIGHT_DTYPES
from radixlm.plan.hardware import gpu_names
from radixlm.plan.models import preset_names
from radixlm.plan.report import Report, render_json, render_text


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def _common(p: argparse.ArgumentParser, gpu: bool = True, tp_list: bool = False) -> None:
    p.add_argument(
        "--model",
        required=True,
        help=f"preset ({', '.join(preset_names())}), radixlm alias "
        "(e.g. smollm2-135m) or path to a config.json",
    )
    if gpu:
        p.add_argument(
            "--gpu",
            default="H100-SXM",
            help=f"{', '.join(gpu_names())} (cpu is measured on the spot)",
        )
        p.add_argument(
            "--flops-eff",
            type=float,
            default=1.0,
            help="achievable fraction of peak FLOP/s (default 1.0 = roofline)",
        )
        p.add_argument(
            "--bw-eff", type=float, default=1.0, help="achievable fraction of peak memory bandwidth"
        )
        p.add_argument(
            "--overhead-ms", type=float, default=0.0, help="fixed cost added to every forward step"
        )
        p.add_argument(
            "--mem-fraction",
            type=float,
            default=0.9,
            help="share of device memory for weights + KV (default 0.9)",
        )
    p.add_argument(
        "--dtype",
        default=None,
        choices=WEIGHT_DTYPES,
        help="weight format (default bf16; fp32 with --gpu cpu)",
    )
    p.add_argument(
        "--kv-dtype",
        default=None,
        choices=KV_DTYPES,
        help="KV-cache format (default bf16; fp32 with --gpu cpu)",
    )
    if tp_list:
        p.add_argument(
            "--tp",
            type=int_list,
            default=[1, 2, 4, 8],
            help="tensor-parallel degrees, comma-separated (default 1,2,4,8)",
        )
    else:
        p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _add(
    sub, name: str, help_text: str, builder: Callable[[argparse.Namespace], Report], **common
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text)
    _common(p, **common)
    p.set_defaults(func=_runner(builder))
    return p


def _runner(builder: Callable[[argparse.Namespace], Report]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            report = builder(args)
        except (ModelNotFoundError, ValueError, KeyError) as exc:
            print(f"radixlm plan: error: {exc}", file=sys.stderr)
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
    plan.set_defaults(func=lambda args: (plan.print_help(), 2)[1])
    sub = plan.add_subparsers(dest="plan_command", metavar="SUBCOMMAND")

    p = _add(
        sub,
        "kv",
        "KV-cache bytes per token and per sequence, by layout and format",
        mem.cmd_kv,
        gpu=False,
        tp_list=True,
    )
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence")
    p.add_argument("--compare", nargs="+", metavar="MODEL", help="models to compare against")

    p = _add(
        sub,
        "capacity",
        "weights, KV budget, tokens and users that fit, per TP degree",
        mem.cmd_capacity,
        tp_list=True,
    )
    p.add_argument("--context", type=int, default=8192, help="tokens per user")
    p.add_argument("--reserve-gib", type=float, default=0.0, help="extra reserve per GPU")
    p.add_argument(
        "--kv-budget-bytes",
        type=int,
        default=None,
        help="KV bytes per GPU (overrides the budget derived from --gpu)",
    )
    p.add_argument("--page-size", type=int, default=1, help="round tokens down to pages")
    p.add_argument("--group-size", type=int, default=128, help="int4 quantization group")

    p = _add(
        sub, "roofline", "arithmetic intensity, ridge, decode knee, step times", perf.cmd_roofline
    )
    p.add_argument("--context", type=int, default=1024, help="cached tokens per sequence")
    p.add_argument(
        "--batches", type=int_list, default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    )
    p.add_argument(
        "--prompts",
        type=int_list,
        default=[128, 512, 2048, 8192],
        help="prompt lengths for the prefill rows",
    )
    p.add_argument("--plot", metavar="PNG", help="write a plot (needs matplotlib)")

    p = _add(sub, "spec", "speculative decoding speed-up and break-even batch", perf.cmd_spec)
    p.add_argument("--acceptance", type=float, default=0.7, help="per-token acceptance rate")
    p.add_argument("--draft-len", type=int, default=4, help="draft tokens per step (k)")
    p.add_argument(
        "--draft-cost", type=float, default=0.05, help="draft step time / target decode step time"
    )
    p.add_argument("--draft-model", help="price the draft as this model (overrides cost)")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batches", type=int_list, default=[1, 4, 16, 64, 256, 1024])

    p = _add(sub, "chunk", "chunked-prefill budget under TPOT and TTFT SLOs", perf.cmd_chunk)
    p.add_argument("--decode-batch", type=int, default=32, help="running decodes")
    p.add_argument("--context", type=int, default=2048, help="their context")
    p.add_argument("--prompt", type=int, default=4096, help="new prompt length")
    p.add_argument("--tpot-ms", type=float, default=50.0)
    p.add_argument("--ttft-ms", type=float, default=2000.0)
    p.add_argument("--align", type=int, default=64, help="chunk size granularity")

    p = _add(
        sub, "disagg", "prefill/decode disaggregation break-even and pool ratio", perf.cmd_disagg
    )
    p.add_argument("--prompt", type=int, default=4096)
    p.add_argument("--output", type=int, default=256)
    p.add_argument(
        "--link-gbps",
        type=float,
        default=400.0,
        help="KV transfer bandwidth per GPU, Gbit/s (400 = one NDR NIC)",
    )
    p.add_argument("--link-latency-ms", type=float, default=0.0)
    p.add_argument("--tpot-ms", type=float, default=50.0)
    p.add_argument("--colocated-batch", type=int, default=32)

    p = _add(
        sub,
        "fleet",
        "replicas and nodes for a request rate and SLO pair",
        perf.cmd_fleet,
        tp_list=True,
    )
    p.add_argument("--rate", type=float, default=10000.0, help="requests per second")
    p.add_argument(
        "--prompt-len", default="1024", help='prompt length or distribution "len:weight,..."'
    )
    p.add_argument("--output-len", default="256", help="output length or distribution")
    p.add_argument("--ttft-ms", type=float, default=2000.0)
    p.add_argument("--tpot-ms", type=float, default=50.0)
    p.add_argument("--utilization", type=float, default=0.8)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument(
        "--prefix-hit",
        type=float,
        default=0.0,
        help="fraction of prompt tokens served from the prefix cache",
    )

    p = _add(
        sub,
        "moe",
        "MoE memory bill vs bandwidth bill, expert activation by batch",
        mem.cmd_moe,
        gpu=False,
    )
    p.add_argument(
        "--batches", type=int_list, default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    )
    return plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlm")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m radixlm.plan ...` (arguments after `plan`)."""
    args = build_parser().parse_args(["plan", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
