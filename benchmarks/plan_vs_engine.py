"""`radixlm plan` predictions against the measured engine, on this CPU.

What it checks
--------------
1. KV bytes per token: `plan kv` vs the engine's KV pool (must be equal).
2. Token capacity: `plan capacity` given the engine's KV budget and page size vs the
   engine's `max_total_tokens` (must be equal).
3. Decode step time at batch 1 (and the other ``--batch-sizes``): the planner's roofline
   prediction on ``--gpu cpu`` (single-thread fp32 matmul FLOP/s and GEMV weight-streaming
   bandwidth, measured on the spot by `radixlm.plan.hardware.measure_cpu`) vs the
   engine's measured step time.

Method for 3: B random-token prompts of ``--prompt-tokens`` tokens (fresh per run, so
the prefix cache never hits), greedy, EOS ignored; generate once with
``max_new_tokens=1`` (t_1) and once with ``max_new_tokens=N`` (t_N); the decode step is
(t_N - t_1) / (N - 1), median over ``--repeats``, in wall time and in process CPU time
(on a shared machine the OS time-slices the single engine thread with other processes;
CPU time leaves that out, wall time does not). The prediction is for the mean context
of those steps (prompt + N / 2). Two predictions are reported:
  * roofline: max(FLOPs / peak, bytes / bandwidth), compute and memory fully
    overlapped: a lower bound on the step time;
  * additive: FLOPs / peak + bytes / bandwidth, no overlap.
Stated tolerance: the measured batch-1 step in process CPU time lies between 1x and
``--tolerance`` (default 3x) the roofline prediction (wall time is reported too; it
matches CPU time on an idle machine). The gap above 1x is what the
roofline leaves out on a CPU: per-op dispatch in Python/PyTorch (about 200 matmuls and
1,000 other ops per step for 30 layers), the attention, norm and sampling passes over
activations, and small GEMVs streaming below the measured rate.

    python benchmarks/plan_vs_engine.py            # batch 1 and 8, 3 repeats
    python benchmarks/plan_vs_engine.py --quick    # batch 1, 1 repeat

Output: a table on stdout and JSON at ``--output``
(default ``benchmarks/results/plan_vs_engine.json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from report import save_report

REPO_ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("radixlm") is None:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "plan_vs_engine.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--tolerance",
        type=float,
        default=3.0,
        help="max measured / roofline-predicted step time at batch 1",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="batch 1, 1 repeat")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.repeats = [1], 1
    return args


def _prompts(rng: random.Random, batch: int, length: int, vocab: int) -> list[list[int]]:
    # ids above the special tokens; a different first token per prompt: no prefix hits
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(batch)]


def measure_step(engine, batch: int, args, rng: random.Random, vocab: int) -> dict:
    """Decode step time at `batch` over `args.repeats` runs: wall time, and process CPU
    time (which excludes the time the OS gives other processes on a shared machine)."""
    params = {"temperature": 0, "ignore_eos": True}
    walls, cpus, loads = [], [], []
    for _ in range(args.repeats):
        timings = []
        for n in (1, args.decode_tokens):
            prompts = _prompts(rng, batch, args.prompt_tokens, vocab)
            w0, c0 = time.perf_counter(), time.process_time()
            out = engine.generate(
                input_ids=prompts, sampling_params={**params, "max_new_tokens": n}
            )
            timings.append((time.perf_counter() - w0, time.process_time() - c0))
            assert all(len(o["output_ids"]) == n for o in out)
        steps = args.decode_tokens - 1
        walls.append((timings[1][0] - timings[0][0]) / steps)
        cpus.append((timings[1][1] - timings[0][1]) / steps)
        loads.append(os.getloadavg()[0])
    return {
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "runs_s": walls,
        "cpu_median_s": statistics.median(cpus),
        "cpu_runs_s": cpus,
        "loadavg": loads,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import radixlm
    from radixlm.plan.capacity import capacity
    from radixlm.plan.cost import Deployment
    from radixlm.plan.hardware import measure_cpu
    from radixlm.plan.kv import kv_bytes_per_token
    from radixlm.plan.models import load_model

    torch.set_num_threads(1)
    model = load_model(args.model)
    hw = measure_cpu()
    dep = Deployment(model, hw, weight_dtype="fp32", kv_dtype="fp32")
    engine = radixlm.Engine(model=args.model, max_total_tokens=16384, num_threads=1)
    info = engine.get_server_info()
    kv_plan = kv_bytes_per_token(model, "fp32")
    cap_plan = capacity(
        model,
        None,
        kv_dtype="fp32",
        kv_budget_bytes=info["kv_budget_bytes"],
        page_size=info["page_size"],
    ).max_tokens
    rng = random.Random(args.seed)
    engine.generate(
        input_ids=_prompts(rng, 1, args.prompt_tokens, model.vocab_size),
        sampling_params={"max_new_tokens": 4, "ignore_eos": True},
    )  # warm-up
    ctx = args.prompt_tokens + args.decode_tokens // 2
    rows = []
    for b in args.batch_sizes:
        step = dep.decode(b, ctx)
        measured = measure_step(engine, b, args, rng, model.vocab_size)
        rows.append(
            {
                "batch": b,
                "context": ctx,
                "roofline_ms": step.time_s * 1e3,
                "additive_ms": (step.compute_s + step.memory_s) * 1e3,
                "compute_ms": step.compute_s * 1e3,
                "memory_ms": step.memory_s * 1e3,
                "measured_ms": measured["median_s"] * 1e3,
                "measured_min_ms": measured["min_s"] * 1e3,
                "measured_cpu_ms": measured["cpu_median_s"] * 1e3,
                "ratio_cpu_time_to_roofline": measured["cpu_median_s"] / step.time_s,
                "ratio_measured_to_roofline": measured["median_s"] / step.time_s,
                "implied_overhead_ms": (measured["median_s"] - step.time_s) * 1e3,
                "runs_ms": [s * 1e3 for s in measured["runs_s"]],
                "loadavg": measured["loadavg"],
            }
        )
    engine.shutdown()
    b1 = next((r for r in rows if r["batch"] == 1), None)
    within = b1 is not None and 1.0 <= b1["ratio_cpu_time_to_roofline"] <= args.tolerance
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
        },
        "measured_cpu": {
            "fp32_flops": hw.flops("fp32"),
            "gemv_bandwidth": hw.mem_bandwidth,
            "copy_bandwidth": hw.copy_bandwidth,
        },
        "kv_bytes_per_token": {
            "plan": kv_plan,
            "engine": info["kv_bytes_per_token"],
            "equal": kv_plan == info["kv_bytes_per_token"],
        },
        "capacity_tokens": {
            "plan": cap_plan,
            "engine": info["max_total_tokens"],
            "equal": cap_plan == info["max_total_tokens"],
        },
        "decode": rows,
        "tolerance": {"batch1_cpu_time_ratio_range": [1.0, args.tolerance], "within": within},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    print(
        f"CPU (1 thread): {hw.flops('fp32') / 1e9:.1f} GFLOP/s fp32 matmul, "
        f"{hw.mem_bandwidth / 1e9:.1f} GB/s GEMV streaming, "
        f"{hw.copy_bandwidth / 1e9:.1f} GB/s copy; loadavg {os.getloadavg()[0]:.2f}"
    )
    print(f"KV bytes/token: plan {kv_plan:,.0f}  engine {info['kv_bytes_per_token']:,}")
    print(f"capacity:       plan {cap_plan:,}  engine {info['max_total_tokens']:,}")
    print(
        f"{'batch':>5} {'roofline ms':>11} {'additive ms':>11} {'wall ms':>8} {'(min)':>7} "
        f"{'cpu ms':>7} {'wall/roofline':>13} {'cpu/roofline':>12}"
    )
    for r in rows:
        print(
            f"{r['batch']:>5} {r['roofline_ms']:>11.2f} {r['additive_ms']:>11.2f} "
            f"{r['measured_ms']:>8.2f} {r['measured_min_ms']:>7.2f} "
            f"{r['measured_cpu_ms']:>7.2f} {r['ratio_measured_to_roofline']:>13.2f} "
            f"{r['ratio_cpu_time_to_roofline']:>12.2f}"
        )
    print(f"batch-1 CPU-time step within [1.0, {args.tolerance}]x roofline: {within}")
    save_report(result, args.output)
    return 0 if result["kv_bytes_per_token"]["equal"] and result["capacity_tokens"]["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
