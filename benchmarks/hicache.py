"""The second KV tier (``--hicache-tier``) on a multi-turn agent workload whose histories
do not fit the KV pool.

Method
------
* Workload: N sessions (``--sessions``, 6) x T turns (``--turns``, 4). A session's first
  prompt is a system prompt of S random token ids (``--system-tokens``, 256) and a first
  message of Q ids (``--turn-tokens``, 48); turn k's prompt is turn k-1's prompt + its
  answer (the generated ids) + a new message of Q ids (a tool result or a user reply).
  Greedy, EOS ignored, M new tokens per turn (``--max-new-tokens``, 16). Fixed ``--seed``.
* Think time: after a turn finishes, its session waits ``--think`` seconds (0.5; each wait
  drawn uniformly from [0.5x, 1.5x] with the seed) before sending the next turn. Sessions
  start ``--stagger`` seconds apart (0.2). While a session thinks, the other sessions'
  turns fill the KV pool (``--pool-tokens``, 1024: the sessions' final histories add up
  to 3 times it) and the radix cache evicts its history.
* Configurations, one fresh in-process `radixlm.Engine` each, run one after another in
  one process on the same weights (the bundled SmolLM2-135M-Instruct, fp32 on CPU,
  ``--threads`` torch threads, 1): ``off`` (no second tier: evicted prefixes are
  dropped) and each tier of ``--tiers`` (default ``disk,host,fp8``), sized
  ``--tier-tokens`` (8192: every history fits). Each engine gets an untimed warm-up
  request on unrelated ids first.
* The engine is driven through ``add_request`` / ``step``; a turn is added once its
  session's think time has passed (the loop sleeps while every session thinks).
  TTFT = time from ``add_request`` to the step that returns the turn's first token.
* Per configuration: hit rate = cached / prompt tokens (``usage.cached_tokens``; counts
  tokens from either tier), prefill tokens computed = prompt - cached, both over all
  turns and over later turns (turn >= 2); TTFT p50 / p99 of later turns; output tokens/s
  = completion tokens / wall time of the workload (think time included); the tier's
  tokens loaded back and seconds spent loading (`/get_server_info`'s ``hicache``);
  ``same out`` = fraction of turns whose greedy ids equal the ``off`` run's (turns
  batch differently from run to run, so fp32 rounding may flip a near-tie even for a
  lossless tier; a lossy tier may flip more).

Output: a table on stdout and JSON at ``--output``
(default ``benchmarks/results/hicache.json``).

    python benchmarks/hicache.py --quick   # smoke run: 3 sessions x 3 turns, 512-token pool
    python benchmarks/hicache.py           # full run (a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch
from engine_throughput import machine_info
from report import print_table_and_save

from radixlm import Engine

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "hicache.json"
QUICK = {"sessions": 3, "turns": 3, "system_tokens": 128, "pool_tokens": 512}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--model", default="smollm2-135m", help="radixlm model alias or path")
    add("--threads", type=int, default=1, help="torch threads")
    add("--sessions", type=int, default=6, help="N: concurrent agent sessions")
    add("--turns", type=int, default=4, help="T: turns per session")
    add("--system-tokens", type=int, default=256, help="S: system prompt tokens")
    add("--turn-tokens", type=int, default=48, help="Q: tokens each turn appends")
    add("--max-new-tokens", type=int, default=16, help="M: new tokens per turn")
    add("--think", type=float, default=0.5, help="mean think time between turns (s)")
    add("--stagger", type=float, default=0.2, help="delay between session starts (s)")
    add("--pool-tokens", type=int, default=1024, help="primary KV pool (tokens)")
    add("--tier-tokens", type=int, default=8192, help="second tier size (tokens)")
    add("--tiers", default="disk,host,fp8", help="tiers to run beside 'off' (comma list)")
    add("--page-size", type=int, default=1, help="KV page size")
    add("--seed", type=int, default=0, help="prompt and think-time RNG seed")
    add("--quick", action="store_true", help="smoke run (small workload)")
    add("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON report path")
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    return args


def make_workload(args: argparse.Namespace) -> tuple[list[list[int]], list[list[list[int]]]]:
    """(system prompt per session, messages per session and turn) as token ids."""
    rng = random.Random(args.seed)
    ids = range(100, 20000)
    systems = [rng.sample(ids, args.system_tokens) for _ in range(args.sessions)]
    msgs = [
        [rng.sample(ids, args.turn_tokens) for _ in range(args.turns)] for _ in range(args.sessions)
    ]
    return systems, msgs


def engine_kwargs(args: argparse.Namespace, tier: str, tier_dir: str) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "max_total_tokens": args.pool_tokens,
        "page_size": args.page_size,
        "num_threads": args.threads,
    }
    if tier != "off":
        kw.update(hicache_tier=tier, hicache_size=str(args.tier_tokens), hicache_dir=tier_dir)
    return kw


def run_config(args: argparse.Namespace, tier: str, tier_dir: str) -> dict[str, Any]:
    """Run the workload on a fresh engine; per-turn records and the tier's counters."""
    systems, msgs = make_workload(args)
    think = random.Random(args.seed + 1)
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0, "ignore_eos": True}
    with Engine(args.model, **engine_kwargs(args, tier, tier_dir)) as engine:
        engine.generate(input_ids=list(range(50, 114)), sampling_params=params)
        engine.flush_cache()
        history = [systems[s] + msgs[s][0] for s in range(args.sessions)]
        ready = [(s * args.stagger, s, 0) for s in range(args.sessions)]
        heapq.heapify(ready)
        inflight: dict[str, dict[str, Any]] = {}
        turns: list[dict[str, Any]] = []
        start = time.perf_counter()
        while ready or inflight:
            now = time.perf_counter() - start
            while ready and ready[0][0] <= now:
                _, s, t = heapq.heappop(ready)
                rid = engine.add_request(input_ids=history[s], sampling_params=params)
                inflight[rid] = {"session": s, "turn": t, "sent": time.perf_counter(),
                                 "ttft": None, "out": []}  # fmt: skip
            if not inflight:
                time.sleep(max(0.0, ready[0][0] - now))
                continue
            for chunk in engine.step():
                rec = inflight[chunk["rid"]]
                if chunk["output_ids"] and rec["ttft"] is None:
                    rec["ttft"] = time.perf_counter() - rec["sent"]
                rec["out"] += chunk["output_ids"]
                if chunk.get("finish_reason") is None:
                    continue
                del inflight[chunk["rid"]]
                s, t = rec["session"], rec["turn"]
                usage = chunk["usage"]
                turns.append({"session": s, "turn": t, "ttft": rec["ttft"], "out": rec["out"],
                              "prompt": usage["prompt_tokens"],
                              "cached": usage["cached_tokens"],
                              "completion": usage["completion_tokens"]})  # fmt: skip
                if t + 1 < args.turns:
                    history[s] = history[s] + rec["out"] + msgs[s][t + 1]
                    wait = args.think * think.uniform(0.5, 1.5)
                    heapq.heappush(ready, (time.perf_counter() - start + wait, s, t + 1))
        wall = time.perf_counter() - start
        info = engine.get_server_info().get("hicache") or {}
    return {"tier": tier, "wall_s": wall, "turns": turns, "hicache": info}


def summarize(run: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    turns = run["turns"]
    later = [r for r in turns if r["turn"] >= 1]

    def hit(rs):
        return sum(r["cached"] for r in rs) / max(1, sum(r["prompt"] for r in rs))

    ttft = sorted(r["ttft"] for r in later)
    out = {
        "tier": run["tier"],
        "wall_s": run["wall_s"],
        "prompt_tokens": sum(r["prompt"] for r in turns),
        "hit_rate": hit(turns),
        "hit_rate_later": hit(later),
        "prefill_tokens": sum(r["prompt"] - r["cached"] for r in turns),
        "prefill_tokens_later": sum(r["prompt"] - r["cached"] for r in later),
        "ttft_p50_ms": 1e3 * statistics.median(ttft),
        "ttft_p99_ms": 1e3 * ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))],
        "output_tok_s": sum(r["completion"] for r in turns) / run["wall_s"],
        "tier_tokens_loaded": run["hicache"].get("tier_tokens_loaded", 0),
        "tier_load_s": run["hicache"].get("tier_load_seconds", 0.0),
        "tier_bytes_per_token": run["hicache"].get("tier_bytes_per_token"),
    }
    if reference is not None:
        ref = {(r["session"], r["turn"]): r["out"] for r in reference["turns"]}
        same = sum(ref.get((r["session"], r["turn"])) == r["out"] for r in turns)
        out["same_out"] = same / len(turns)
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| tier | B/token | hit rate (later) | prefill tok (later) | TTFT p50 ms | TTFT p99 ms "
        "| out tok/s | loaded tok | load s | same out |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tier']} | {r['tier_bytes_per_token'] or '-'} "
            f"| {r['hit_rate']:.2f} ({r['hit_rate_later']:.2f}) "
            f"| {r['prefill_tokens']} ({r['prefill_tokens_later']}) "
            f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['output_tok_s']:.1f} "
            f"| {r['tier_tokens_loaded']} | {r['tier_load_s']:.3f} "
            f"| {r.get('same_out', 1.0):.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    load_before = os.getloadavg()
    tiers = ["off"] + [t for t in args.tiers.split(",") if t and t != "off"]
    runs, rows = [], []
    with tempfile.TemporaryDirectory(prefix="radixlm-hicache-bench-") as tier_dir:
        for tier in tiers:
            print(f"running tier={tier} ...", file=sys.stderr)
            run = run_config(args, tier, tier_dir)
            runs.append(run)
            rows.append(summarize(run, runs[0] if tier != "off" else None))
    final_history = args.sessions * (
        args.system_tokens + args.turns * (args.turn_tokens + args.max_new_tokens)
    )
    lines = table(rows) + [
        "",
        f"{args.sessions} sessions x {args.turns} turns, final histories "
        f"{final_history} tokens = {final_history / args.pool_tokens:.1f}x the "
        f"{args.pool_tokens}-token pool; later turns = turn >= 2",
    ]
    print_table_and_save(
        lines, args.output, args, load_before, machine=machine_info(), rows=rows, runs=runs
    )


if __name__ == "__main__":
    main()
