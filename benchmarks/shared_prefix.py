"""The generated-shared-prefix workload through radixlm's scheduler: radix cache vs NoCache.

Method
------
* Workload (same generator as ``prefix_cache.py``): G groups (``--groups``, 4) x P
  prompts (``--prompts-per-group``, 8); each group shares a system prompt of S random
  token ids (``--system-tokens``, 256) followed by a unique question of Q ids
  (``--question-tokens``, 32). Greedy, EOS ignored, M new tokens (``--max-new-tokens``,
  16) per request.
* Arrival: every request is queued at t=0 in group-interleaved order (g0 q0, g1 q0, ...,
  g0 q1, ...), the order an agent fleet produces when many sessions share a few system
  prompts; the scheduler is stepped until idle (``Scheduler.step``).
* Configurations, one fresh engine each (bundled SmolLM2-135M, float32, CPU, one thread,
  default chunked prefill 512 and ``--max-total-tokens`` from the workload):
  ``radix lpm`` (radix cache, longest-prefix-match policy), ``radix fcfs`` (radix cache,
  first come first served), ``NoCache`` (``--disable-radix-cache``), and ``tight lpm`` /
  ``tight fcfs`` with a pool of 2*S + P*(Q+M) tokens (about two system prompts: the
  cache must be used before eviction takes it). An untimed warm-up request on unrelated
  tokens runs first.
* Reported per configuration: wall time; throughput = (prompt + output tokens) / wall
  time; TTFT (time from t=0 to a request's first token) p50 and p99 over requests;
  cache hit rate = cached prompt tokens / prompt tokens; prefill tokens computed
  (scheduler counter); extend and decode steps. ``os.getloadavg()`` is recorded: on a
  shared machine compare runs with similar load.

    python benchmarks/shared_prefix.py --quick   # G=2, P=4, S=128
    python benchmarks/shared_prefix.py           # G=4, P=8, S=256
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch
from engine_throughput import machine_info
from prefix_cache import make_prompts
from report import save_report

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "shared_prefix.json"
CONFIGS = {
    "radix lpm": {"schedule_policy": "lpm"},
    "radix fcfs": {"schedule_policy": "fcfs"},
    "NoCache": {"disable_radix_cache": True},
    # Tight pool (about two system prompts plus one group's questions): the cache must
    # be used before eviction takes it, which is where the policy matters.
    "tight lpm": {"schedule_policy": "lpm", "tight": True},
    "tight fcfs": {"schedule_policy": "fcfs", "tight": True},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--model", default="smollm2-135m", help="radixlm model alias or path")
    add("--threads", type=int, default=1, help="torch threads")
    add("--groups", type=int, default=4, help="G: groups sharing a system prompt")
    add("--prompts-per-group", type=int, default=8, help="P: prompts per group")
    add("--system-tokens", type=int, default=256, help="S: shared system prompt tokens")
    add("--question-tokens", type=int, default=32, help="Q: unique question tokens")
    add("--max-new-tokens", type=int, default=16, help="M: new tokens per request")
    add("--max-total-tokens", type=int, help="KV pool (default: G*(S+P*(Q+M))+1024)")
    add("--seed", type=int, default=0, help="prompt RNG seed")
    add("--quick", action="store_true", help="smoke run: G=2, P=4, S=128")
    add("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON output path")
    args = p.parse_args(argv)
    if args.quick:
        args.groups, args.prompts_per_group, args.system_tokens = 2, 4, 128
    return args


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def run_config(name: str, settings: dict, prompts, warmup, args, max_total: int) -> dict:
    from radixlm import Engine
    from radixlm.runtime.sampling.sampler import SamplingParams
    from radixlm.runtime.sched.request import Req

    kwargs = {k: v for k, v in settings.items() if k != "tight"}
    if settings.get("tight"):
        S, Q, M = args.system_tokens, args.question_tokens, args.max_new_tokens
        max_total = 2 * S + args.prompts_per_group * (Q + M)
    engine = Engine(
        args.model,
        max_total_tokens=max_total,
        num_threads=args.threads,
        log_level="warning",
        **kwargs,
    )
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0, ignore_eos=True)
    engine.generate(input_ids=warmup, sampling_params={"max_new_tokens": 2})  # untimed
    sched = engine.scheduler
    before = sched.stats()
    G, P = args.groups, args.prompts_per_group
    order = [g * P + i for i in range(P) for g in range(G)]  # group-interleaved arrival
    for k in order:
        sched.add_request(Req(rid=f"b{k}", input_ids=prompts[k], params=params))
    ttft: dict[str, float] = {}
    outputs: dict[str, list[int]] = {}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    while sched.waiting or sched.running or sched.chunked:
        for out in sched.step():
            if out.new_token_ids and out.rid not in ttft:
                ttft[out.rid] = time.perf_counter() - start
            outputs.setdefault(out.rid, []).extend(out.new_token_ids)
    seconds = time.perf_counter() - start
    after = sched.stats()
    engine.shutdown()
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = sum(len(o) for o in outputs.values())
    assert output_tokens == len(prompts) * args.max_new_tokens
    cached = after["cached_tokens_total"] - before["cached_tokens_total"]
    rec = {
        "config": name,
        "settings": settings,
        "max_total_tokens": max_total,
        "seconds": seconds,
        "tok_s": (prompt_tokens + output_tokens) / seconds,
        "output_tok_s": output_tokens / seconds,
        "ttft_p50_s": statistics.median(ttft.values()),
        "ttft_p99_s": percentile(list(ttft.values()), 99),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "hit_rate": cached / prompt_tokens,
        "prefill_tokens": after["prefill_tokens_total"] - before["prefill_tokens_total"],
        "extend_steps": after["num_extend_steps"] - before["num_extend_steps"],
        "decode_steps": after["num_decode_steps"] - before["num_decode_steps"],
        "retracted": after["num_retracted_total"] - before["num_retracted_total"],
        "loadavg": [load, os.getloadavg()[0]],
        "outputs": [outputs[f"b{k}"] for k in range(len(prompts))],
    }
    print(f"  {name}: {seconds:.1f} s, {rec['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
    return rec


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from radixlm.runtime.executor.model_registry import local_hf_dir

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(local_hf_dir(args.model))
    prompts, warmup = make_prompts(args, tok.vocab_size, tok.all_special_ids)
    G, P, S, Q, M = (
        args.groups,
        args.prompts_per_group,
        args.system_tokens,
        args.question_tokens,
        args.max_new_tokens,
    )
    max_total = args.max_total_tokens or G * (S + P * (Q + M)) + 1024
    results = [run_config(n, s, prompts, warmup, args, max_total) for n, s in CONFIGS.items()]
    same = all(r["outputs"] == results[0]["outputs"] for r in results)
    for r in results:
        del r["outputs"]
    return {
        "benchmark": "shared_prefix",
        "workload": "generated-shared-prefix, group-interleaved arrival at t=0",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "machine": machine_info(),
        "versions": {"torch": torch.__version__},
        "settings": {
            "model": args.model,
            "threads": args.threads,
            "groups": G,
            "prompts_per_group": P,
            "system_tokens": S,
            "question_tokens": Q,
            "max_new_tokens": M,
            "max_total_tokens": max_total,
            "seed": args.seed,
            "dtype": "float32",
            "device": "cpu",
            "sampling": "greedy, EOS ignored",
        },
        "definitions": {
            "tok_s": "(prompt + output tokens) / wall time",
            "ttft": "seconds from t=0 (all requests queued) to the request's first token",
            "hit_rate": "cached prompt tokens / prompt tokens",
            "prefill_tokens": "tokens computed by extend steps",
            "optimal_hit_rate": "(G*P - G) * S / prompt tokens (each system prompt once)",
        },
        "optimal_hit_rate": (G * P - G) * S / (G * P * (S + Q)),
        "greedy_outputs_identical": same,
        "results": results,
    }


def format_table(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"shared_prefix: G={s['groups']} P={s['prompts_per_group']} S={s['system_tokens']} "
        f"Q={s['question_tokens']} M={s['max_new_tokens']}, {s['threads']} thread(s); "
        f"optimal hit rate {report['optimal_hit_rate']:.3f}",
        f"{'config':12s} {'pool':>6s} {'wall s':>7s} {'tok/s':>7s} {'TTFT p50':>9s} "
        f"{'TTFT p99':>9s} {'hit rate':>8s} {'prefill':>8s}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['config']:12s} {r['max_total_tokens']:6d} {r['seconds']:7.1f} "
            f"{r['tok_s']:7.1f} {r['ttft_p50_s']:9.2f} {r['ttft_p99_s']:9.2f} "
            f"{r['hit_rate']:8.3f} {r['prefill_tokens']:8d}"
        )
    lines.append(f"greedy outputs identical across configs: {report['greedy_outputs_identical']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_benchmark(args)
    print(format_table(report))
    save_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
