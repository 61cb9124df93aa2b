"""radixlm's step times beside a busy neighbour process, per OpenMP wait policy.

    python benchmarks/contention.py                 # 2 threads, passive vs spin, 2 reps
    python benchmarks/contention.py --quick         # 1 rep, fewer tokens

A shared machine rarely has its cores to itself. This script measures what one other
busy process does to radixlm's CPU steps, and how the OpenMP wait policy decides it
(`radixlm/omp_policy.py`):

* policies: ``radixlm default`` (a short spin, ``GOMP_SPINCOUNT=1000``, set by
  `import radixlm`), ``passive`` (``OMP_WAIT_POLICY=PASSIVE``: no spin) and ``spin``
  (libgomp's own default, ``GOMP_SPINCOUNT=300000``), at ``--threads`` compute threads;
  plus ``1 thread`` (radixlm's default policy) as the reference a single core gives;
* conditions: ``quiet`` and ``busy`` (``--neighbours`` busy-looping Python processes,
  each at nice 19 in a session of its own, as a build or another user's job would be:
  Linux autogroups then give each session an equal CPU share, whatever its nice value);
* per run, a fresh engine process (`--child`) times, from the scheduler's own forward
  calls: the decode step at batch 1 and at batch 16 (median over `--new-tokens` steps,
  32-token prompts) and the prefill step of one 512-token prompt.

``--spin-counts N ...`` adds a policy per libgomp spin count. The script first waits (up
to 60 s) for idle CPUs; runs alternate the policies within each repetition; the table
gives the median over repetitions and each busy row's slowdown against the same policy's
quiet row. Writes ``benchmarks/results/contention.json`` (``--quick``:
``contention_quick.json``) with the CPU model and the autogroup setting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import busy_neighbours, wait_for_quiet  # noqa: E402
from report import save_report  # noqa: E402

from radixlm.omp_policy import DEFAULTS, MARKER  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "contention.json"
QUICK_RESULTS = RESULTS.with_name("contention_quick.json")
#: Environment per policy: the variables radixlm.omp_policy leaves alone when set.
POLICIES = {
    "radixlm default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin": {"GOMP_SPINCOUNT": "300000"},
}
METRICS = ("decode_b1_ms", "decode_b16_ms", "prefill_512_ms")


def child(threads: int, new_tokens: int) -> dict[str, Any]:
    """In a fresh process: one engine, the three step times (ms) and the policy in effect."""
    import radixlm

    engine = radixlm.Engine(
        model="smollm2-135m", num_threads=threads, max_total_tokens=8192, log_level="warning"
    )
    runner = engine.scheduler.runner
    forward, steps = runner.forward, []

    def timed(fb):
        t = time.perf_counter()
        out = forward(fb)
        steps.append((fb.mode.name, time.perf_counter() - t))
        return out

    runner.forward = timed
    params = {"temperature": 0, "ignore_eos": True}
    engine.generate([7] * 32, {**params, "max_new_tokens": 4})  # warm-up
    result: dict[str, Any] = {
        "omp_wait_policy": engine.get_server_info()["resolved"]["omp_wait_policy"]
    }
    for name, batch in (("decode_b1_ms", 1), ("decode_b16_ms", 16)):
        steps.clear()
        prompts = [[100 + i + j for j in range(32)] for i in range(batch)]
        engine.generate(prompts, {**params, "max_new_tokens": new_tokens})
        result[name] = 1e3 * statistics.median(t for m, t in steps if m == "DECODE")
    steps.clear()
    engine.generate([[300 + j % 900 for j in range(512)]], {**params, "max_new_tokens": 1})
    result["prefill_512_ms"] = 1e3 * sum(t for m, t in steps if m == "EXTEND")
    engine.shutdown()
    return result


def run_child(threads: int, env_extra: dict[str, str], new_tokens: int) -> dict[str, Any]:
    """One `child` run in a fresh process whose OpenMP variables are exactly env_extra."""
    drop = {*DEFAULTS, MARKER}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra)
    cmd = [sys.executable, __file__, "--child", "--threads", str(threads)]
    cmd += ["--new-tokens", str(new_tokens)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"engine run failed ({cmd}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu_model() -> str:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="compute threads (default 2)")
    ap.add_argument("--neighbours", type=int, default=1, help="busy processes (default 1)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions (default 2)")
    ap.add_argument("--new-tokens", type=int, default=16, help="decode steps timed (16)")
    ap.add_argument(
        "--spin-counts",
        type=int,
        nargs="*",
        default=[],
        help="more policies: GOMP_SPINCOUNT values to run beside the three (default none)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"1 repetition, 8 decode steps (overrides --reps, --new-tokens); default output "
        f"{QUICK_RESULTS.name}",
    )
    ap.add_argument("--output", type=Path, default=None, help=f"JSON (default {RESULTS.name})")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.threads, args.new_tokens)))
        return
    if args.threads < 2 or args.neighbours < 1 or args.reps < 1 or args.new_tokens < 2:
        ap.error("need --threads >= 2, --neighbours >= 1, --reps >= 1, --new-tokens >= 2")
    if any(n < 0 for n in args.spin_counts):
        ap.error("--spin-counts must be >= 0")
    if args.output is None:
        args.output = QUICK_RESULTS if args.quick else RESULTS
    reps, new_tokens = (1, 8) if args.quick else (args.reps, args.new_tokens)
    configs = [(name, args.threads, env) for name, env in POLICIES.items()]
    configs += [(f"spin {n}", args.threads, {"GOMP_SPINCOUNT": str(n)}) for n in args.spin_counts]
    configs.append(("1 thread", 1, POLICIES["radixlm default"]))
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    load = {"before": os.getloadavg()}
    quiet_wait = wait_for_quiet()
    for condition in ("quiet", "busy"):
        with busy_neighbours(args.neighbours if condition == "busy" else 0):
            for rep in range(reps):
                for name, threads, env in configs:
                    r = run_child(threads, env, new_tokens)
                    runs.setdefault((condition, name), []).append(r)
                    print(f"{condition} {name} rep {rep}: {r}", file=sys.stderr, flush=True)
    load["after"] = os.getloadavg()
    rows = []
    for (condition, name), rs in runs.items():
        row = {"condition": condition, "policy": name, "omp_wait_policy": rs[0]["omp_wait_policy"]}
        row.update({m: statistics.median(r[m] for r in rs) for m in METRICS})
        row["runs"] = rs
        rows.append(row)
    quiet = {r["policy"]: r for r in rows if r["condition"] == "quiet"}
    print(f"\n{args.threads} threads, {args.neighbours} busy neighbour(s), median of {reps}\n")
    print("| condition | policy | decode B=1 ms | decode B=16 ms | prefill 512 ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        cells = []
        for m in METRICS:
            cell = f"{r[m]:.1f}"
            if r["condition"] == "busy":
                cell += f" ({r[m] / quiet[r['policy']][m]:.2f}x)"
            cells.append(cell)
        print(f"| {r['condition']} | {r['policy']} | " + " | ".join(cells) + " |")
    report = {
        "threads": args.threads,
        "neighbours": args.neighbours,
        "reps": reps,
        "new_tokens": new_tokens,
        "load": load,
        "quiet_wait": {"waited_s": quiet_wait[0], "busy": quiet_wait[1]},
        "cpu": _cpu_model(),
        "autogroup": _read("/proc/sys/kernel/sched_autogroup_enabled"),
        "rows": rows,
    }
    save_report(report, args.output)


if __name__ == "__main__":
    main()
