"""radixlm next to the engines people would use instead: same weights, threads, workloads.

Method
------
* Weights: SmolLM2-135M-Instruct, fp32, from the bundled GGUF dequantized once into a
  safetensors directory (`radixlm.runtime.executor.model_registry.local_hf_dir`, cached under
  ~/.cache/radixlm/converted); every engine loads that directory (llama-server: an f32
  GGUF converted from it, see docs/benchmarks.md).
* Engines (`ENGINES`): in-process -- radixlm.Engine and transformers `generate`, each in
  a fresh subprocess running `engine_harness.py` (same harness, same timing); HTTP --
  `radixlm serve`, vLLM CPU and llama.cpp's llama-server, each started here and driven by
  `radixlm.bench` over streaming /v1/completions. OpenVINO GenAI and onnxruntime-genai
  run in the same harness under their own venvs, on their exported copies of the same
  weights. A peer without its venv / exported model shows as not installed. radixlm
  also runs with a float16 KV cache (`-kv16` rows), with n-gram speculation (`-ngram`
  rows) and on the bundled GGUF itself, its Q4_1 / Q8_0 blocks kept packed (`-gguf` rows:
  the same weight values bit for bit, computed in fp32, a sixth of the bytes per decode
  step; their "of roofline" uses the fp32 weights' bytes, so it can pass 100%); each gets
  its own ratio column; `radixlm-nomix` rows run `--no-enable-mixed-chunk` (ratio: plain
  radixlm, which mixes, over them).
* Workloads (token ids, identical for all engines; greedy, EOS ignored): single (1 x 32
  in / 128 out), burst16 (16 x 256 / 64), shared16-cold and shared16-warm (16 x (200
  shared + 56 own) / 64, the warm burst with new suffixes after the cold one), evict
  (4 groups x 16 of a 512-token system prompt + 64 / 32, in a 8192-token KV pool for
  radixlm), multiturn (4 sessions x 4 turns: 256 tokens, +32 per turn, 32 out, each turn
  resends the history with the previous answers).
* Protocol: for each thread count (--threads, 1 and 2), each repetition (--reps, 3) runs
  every engine in turn, the order reversed on every other one (A B C, C B A, A B C), so a
  drift in the machine's speed over the run hits them alike; each run starts the engine
  fresh (cold caches) and runs the
  workloads in the order above. Before each run the script waits (up to 60 s) until the
  CPUs are at most 10% busy (the log says when a run started anyway); HTTP servers are
  stopped with their whole process group. With --neighbours N, N busy-looping processes
  (nice 19, each in its own session) run beside every engine run, started after the quiet
  wait: how each engine copes with a shared machine (the roofline stays the quiet one's).
  `os.getloadavg()` and the busy fraction before, the load after each run. Reported:
  output tokens/s median (min-max) over repetitions, TTFT and TPOT p50/p99 of the median
  repetition, cache hit rate, radixlm's ratio (in-process vs in-process peers, HTTP vs
  HTTP peers): the median of the ratios within each repetition (paired).
* Machine, per thread count, before and after its runs (the better of the two is used):
  memory bandwidth (the better of a read and a copy of a 256 MiB tensor, best of 5 each)
  and fp32 peak (the better of torch's 2048^3 matmul and radixlm's packed GEMM). The
  single-stream decode step (radixlm TPOT p50 of `single`) is printed as a ratio to
  weight bytes / bandwidth, the step time of a purely memory-bound decoder; each
  workload gets its roofline (`machine.py`: the output tokens/s of an ideal prefix-cached
  engine at that peak and bandwidth) and every row the fraction of it that the engine
  reached. The roofline lets prefill arithmetic overlap decode weight reads; the line
  also gives the bound without that overlap (all prefill, then the decode passes), the
  one that binds for an engine that prefills a burst before decoding it, or that does
  not stagger lockstep multi-turn sessions.

    python benchmarks/compare_engines.py --quick --threads 1     # 1 repetition, smaller evict
    python benchmarks/compare_engines.py                          # threads 1 and 2, 3 reps
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import (
    busy_neighbours,
    memory_bandwidth,
    model_params,
    peak_flops,
    roofline,
    wait_for_quiet,
    workload_work,
)
from peer_servers import ENGINES, EngineSpec, engine_environ, http_run
from report import save_report

from radixlm.bench.stats import RequestResult, summarize
from radixlm.runtime.executor.model_registry import local_hf_dir

HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "results" / "compare_engines.json"
QUICK_OUTPUT = HERE / "results" / "compare_engines_quick.json"
WORKLOAD_NAMES = ("single", "burst16", "shared16-cold", "shared16-warm", "evict", "multiturn")
RADIXLM_KV_TOKENS = 8192
QUIET_BUSY = 0.10  # a run starts once the CPUs are at most this busy (or after 60 s)


def build_workloads(tok, quick: bool, seed: int = 0) -> list[dict[str, Any]]:
    """The workloads as JSON-ready sessions of [token ids, output length] turns."""
    rng = random.Random(seed)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]

    def ids(n: int) -> list[int]:
        return [rng.choice(vocab) for _ in range(n)]

    def single_turns(prompts: list[list[int]], out: int) -> list[dict[str, Any]]:
        return [{"turns": [[p, out]], "resend_history": False} for p in prompts]

    shared = ids(200)
    groups, per_group = (4, 8) if quick else (4, 16)
    systems = [ids(512) for _ in range(groups)]
    evict = [systems[g] + ids(64) for g in range(groups) for _ in range(per_group)]
    rng.shuffle(evict)
    multi = [
        {"turns": [[ids(256), 32]] + [[ids(32), 32] for _ in range(3)], "resend_history": True}
        for _ in range(4)
    ]
    cold = [shared + ids(56) for _ in range(16)]
    warm = [shared + ids(56) for _ in range(16)]
    return [
        {"name": "single", "sessions": single_turns([ids(32)], 128)},
        {"name": "burst16", "sessions": single_turns([ids(256) for _ in range(16)], 64)},
        {"name": "shared16-cold", "sessions": single_turns(cold, 64)},
        {"name": "shared16-warm", "sessions": single_turns(warm, 64)},
        {"name": "evict", "sessions": single_turns(evict, 32)},
        {"name": "multiturn", "sessions": multi},
    ]


def to_results(requests: list[dict[str, Any]]) -> list[RequestResult]:
    """Harness request dicts as bench RequestResults (successful, times in seconds)."""
    keys = ("prompt_tokens", "output_tokens", "cached_tokens", "ttft", "e2e", "itl", "start")
    return [RequestResult(success=True, **{k: r[k] for k in keys}) for r in requests]


def run_inprocess(spec: EngineSpec, model_dir: Path, threads: int, wl_file: Path) -> dict:
    """One repetition in a fresh harness subprocess; per workload (results, duration)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [spec.python or sys.executable, str(HERE / "engine_harness.py"),
               "--engine", spec.harness, "--model-dir", str(spec.model_dir or model_dir),
               "--threads", str(threads), "--spec", str(wl_file), "--out", str(out)]  # fmt: skip
        env = engine_environ(spec, threads, TOKENIZERS_PARALLELISM="false")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{spec.name} harness failed:\n{proc.stderr[-2000:]}")
        report = json.loads(out.read_text())
    return {
        name: (to_results(w["requests"]), w["duration_s"])
        for name, w in report["workloads"].items()
    }


def measure_machine(threads: int) -> dict[str, float]:
    """Memory bandwidth (GB/s) and fp32 peak (GFLOP/s) on `threads` threads, now."""
    return {"bandwidth": memory_bandwidth(threads) / 1e9, "peak": peak_flops(threads) / 1e9}


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median / min / max output tokens/s over repetitions; latencies of the median run."""
    if not runs:
        return {}
    tps = [r["output_throughput"] for r in runs]
    med = sorted(runs, key=lambda r: r["output_throughput"])[len(runs) // 2]
    return {
        "output_tps_median": statistics.median(tps),
        "output_tps": tps,  # per repetition, in run order (paired ratios)
        "output_tps_min": min(tps),
        "output_tps_max": max(tps),
        "ttft_ms": med["ttft_ms"],
        "tpot_ms": med["tpot_ms"],
        "cache_hit_rate": med["cache_hit_rate"],
        "reps": len(runs),
    }


def markdown_table(
    table: dict[str, Any], engines: list[EngineSpec], roof: dict[str, dict[str, Any]]
) -> str:
    """One markdown table: workload x engine, with the fraction of the workload's roofline
    (`roof[threads][workload]`) reached and radixlm's throughput ratios."""
    head = (
        "| threads | workload | engine | out tok/s median (min-max) | of roofline "
        "| TTFT p50 / p99 ms | TPOT p50 / p99 ms | cache hit | radixlm / engine "
        "| radixlm fp16 KV / engine | radixlm + n-gram / engine | radixlm GGUF blocks / engine |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for threads, by_wl in table.items():
        for wl, by_engine in by_wl.items():
            for e in engines:
                row = by_engine.get(e.name)
                if row is None or "status" in row:
                    status = "not run" if row is None else row["status"].split(" (")[0]
                    lines.append(f"| {threads} | {wl} | {e.name} | {status} | | | | | | | | |")
                    continue
                refs = (e.reference, e.reference_kv16, e.reference_ngram, e.reference_gguf)
                ratios = " | ".join(_ratio(by_engine.get(name or "", {}), row) for name in refs)
                ceiling = roof.get(threads, {}).get(wl, {}).get("tokens_per_s")
                of_roof = f"{row['output_tps_median'] / ceiling:.0%}" if ceiling else ""
                hit = row["cache_hit_rate"]
                t, p = row["ttft_ms"], row["tpot_ms"]
                lines.append(
                    f"| {threads} | {wl} | {e.name} | {row['output_tps_median']:.1f} "
                    f"({row['output_tps_min']:.1f}-{row['output_tps_max']:.1f}) | {of_roof} | "
                    f"{_ms(t['p50'])} / {_ms(t['p99'])} | {_ms(p['p50'])} / {_ms(p['p99'])} | "
                    f"{'n/a' if hit is None else f'{hit:.2f}'} | {ratios} |"
                )
    return "\n".join(lines)


def _ratio(ref: dict[str, Any], row: dict[str, Any]) -> str:
    """ref's output tokens/s over row's ("" when ref did not run): the median of the
    ratios within each repetition (paired: a repetition runs every engine back to back), or
    of the medians when the two ran a different number of repetitions."""
    if not ref.get("output_tps_median"):
        return ""
    a, b = ref.get("output_tps", []), row.get("output_tps", [])
    if a and len(a) == len(b):
        return f"{statistics.median(x / y for x, y in zip(a, b)):.2f}x"
    return f"{ref['output_tps_median'] / row['output_tps_median']:.2f}x"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="compute thread counts to run, each for every engine (default 1 2)",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions per engine (default 3)")
    p.add_argument("--engines", default=",".join(e.key for e in ENGINES),
                   help="comma-separated keys: " + ", ".join(e.key for e in ENGINES))  # fmt: skip
    p.add_argument("--workloads", default=None,
                   help="comma-separated subset of: " + ", ".join(WORKLOAD_NAMES))  # fmt: skip
    p.add_argument(
        "--quick",
        action="store_true",
        help="1 repetition, evict with 4 x 8; default output " + QUICK_OUTPUT.name,
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"JSON report (default benchmarks/results/{DEFAULT_OUTPUT.name})",
    )
    p.add_argument(
        "--neighbours",
        type=int,
        default=0,
        help="busy-looping processes (nice 19, own sessions) running beside each engine run, "
        "started once the machine is quiet (default 0: a quiet machine)",
    )
    args = p.parse_args(argv)
    for flag, given, known in (("--engines", args.engines, [e.key for e in ENGINES]),
                               ("--workloads", args.workloads, WORKLOAD_NAMES)):  # fmt: skip
        if given is None:
            continue
        names = set(given.split(",")) - {""}
        unknown = sorted(names - set(known))
        if unknown or not names:
            what = f"unknown {', '.join(unknown)}" if unknown else "none given"
            p.error(f"{flag}: {what}; known: {', '.join(known)}")
    chosen = set(args.workloads.split(",")) if args.workloads else set(WORKLOAD_NAMES)
    if "shared16-warm" in chosen and "shared16-cold" not in chosen:
        # the warm burst finds its shared prefix cached only after the cold one ran
        p.error("--workloads: shared16-warm needs shared16-cold (it warms the cache)")
    if min(args.threads) < 1 or args.reps < 1:
        p.error("--threads and --reps must be at least 1")
    if args.neighbours < 0:
        p.error("--neighbours must be at least 0")
    if args.quick:
        args.reps = 1
    if args.output is None:
        args.output = QUICK_OUTPUT if args.quick else DEFAULT_OUTPUT
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    model_dir = local_hf_dir("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(model_dir)
    workloads = build_workloads(tok, args.quick)
    if args.workloads:
        keep = set(args.workloads.split(","))
        workloads = [w for w in workloads if w["name"] in keep]
    wanted = set(args.engines.split(","))
    engines = [e for e in ENGINES if e.key in wanted]
    wl_file = Path(tempfile.mkstemp(prefix="compare-engines-", suffix=".json")[1])
    wl_file.write_text(json.dumps({"workloads": workloads, "max_total_tokens": RADIXLM_KV_TOKENS,
                                   "max_batch": 16}))  # fmt: skip
    status = {e.name: e.availability() for e in engines}
    raw: dict[str, Any] = {}
    table: dict[str, Any] = {}
    machine: dict[str, Any] = {}
    try:
        for threads in args.threads:
            machine[str(threads)] = probe = {"before": measure_machine(threads)}
            runs: dict[str, dict[str, list]] = {}
            for rep in range(args.reps):
                for e in engines if rep % 2 == 0 else engines[::-1]:  # A B C, C B A, ...
                    if status[e.name] is not None:
                        continue
                    waited, busy = wait_for_quiet(QUIET_BUSY)
                    load_before = os.getloadavg()
                    head = f"[threads {threads} rep {rep + 1}] {e.name}"
                    quiet = f"waited {waited:.0f} s for quiet, CPUs {busy:.0%} busy"
                    if busy > QUIET_BUSY:
                        quiet += ", NOT QUIET: started anyway"
                    print(f"{head} ({quiet})", file=sys.stderr, flush=True)
                    t0 = time.perf_counter()
                    try:
                        with busy_neighbours(args.neighbours):
                            if e.harness:
                                per_wl = run_inprocess(e, model_dir, threads, wl_file)
                            else:
                                per_wl = http_run(
                                    e, model_dir, threads, workloads, tok, RADIXLM_KV_TOKENS
                                )
                    except Exception as exc:  # noqa: BLE001 - record and keep comparing
                        last = (str(exc).splitlines() or [type(exc).__name__])[-1]
                        status[e.name] = f"failed: {last[:120]}"
                        print(f"  {status[e.name]}", file=sys.stderr)
                        continue
                    meta = {"load_before": load_before, "load_after": os.getloadavg(),
                            "busy_before": busy, "quiet_wait_s": waited,
                            "neighbours": args.neighbours,
                            "wall_s": time.perf_counter() - t0, "rep": rep}  # fmt: skip
                    raw.setdefault(str(threads), {}).setdefault(e.name, []).append(meta)
                    for wl, (results, duration) in per_wl.items():
                        s = summarize(results, duration)
                        meta[wl] = s
                        runs.setdefault(wl, {}).setdefault(e.name, []).append(s)
                    print(f"  done in {meta['wall_s']:.0f} s, load {load_before[0]:.2f} -> "
                          f"{meta['load_after'][0]:.2f}", file=sys.stderr, flush=True)  # fmt: skip
            wait_for_quiet()
            probe["after"] = measure_machine(threads)
            table[str(threads)] = {
                w["name"]: {
                    e.name: (
                        summarize_runs(runs.get(w["name"], {}).get(e.name, []))
                        if status[e.name] is None
                        else {"status": status[e.name]}
                    )
                    for e in engines
                }
                for w in workloads
            }
    finally:
        wl_file.unlink(missing_ok=True)
    body, logits, weights = model_params(model_dir)
    seen: list[list[int]] = []
    work = {w["name"]: workload_work(w, seen) for w in workloads}
    roof: dict[str, dict[str, Any]] = {}
    decode = {}
    for threads, probe in machine.items():
        best = {k: max(probe["before"][k], probe["after"][k]) for k in ("bandwidth", "peak")}
        probe["used"] = best
        roof[threads] = {name: roofline(wk, body, logits, weights, best["peak"] * 1e9,
                                         best["bandwidth"] * 1e9)
                         for name, wk in work.items()}  # fmt: skip
        row = table[threads].get("single", {}).get("radixlm (in-process)", {})
        step = (row.get("tpot_ms") or {}).get("p50")
        bound_ms = weights / (best["bandwidth"] * 1e9) * 1000
        decode[threads] = None if step is None else {"step_ms": step, "ratio": step / bound_ms}
        print(f"threads {threads}: memory bandwidth {best['bandwidth']:.1f} GB/s, fp32 peak "
              f"{best['peak']:.0f} GFLOP/s (better of before / after the runs)")  # fmt: skip
        if step is not None:
            print(f"threads {threads}: single-stream decode step {step:.1f} ms = "
                  f"{step / bound_ms:.2f}x the memory-bound step ({weights / 1e6:.0f} MB / "
                  f"{best['bandwidth']:.1f} GB/s = {bound_ms:.1f} ms)")  # fmt: skip
        for name, r in roof[threads].items():
            print(f"threads {threads}: {name} roofline {r['tokens_per_s']:.0f} output tok/s "
                  f"({r['bound']}-bound, {r['flops'] / 1e9:.0f} GFLOP); "
                  f"{r['serial_tokens_per_s']:.0f} without prefill / decode overlap")  # fmt: skip
    markdown = markdown_table(table, engines, roof)
    print(markdown)
    save_report(
        {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "weights_bytes": weights, "body_params": body,
                        "logit_params": logits, "by_threads": machine},
            "workload_work": work,
            "roofline": roof,
            "args": {k: str(v) for k, v in vars(args).items()},
            "engine_status": {k: v or "ok" for k, v in status.items()},
            "table": table,
            "decode_vs_bandwidth": decode,
            "runs": raw,
            "markdown": markdown,
        },
        args.output,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
