"""radixlm.lang programs with the radix cache on vs off (NoCache).

Method
------
* Programs (from ``examples/``, greedy): ``few-shot`` = `few_shot_qa` over N questions
  with `run_batch` (a 5-example prefix shared by all), ``branching`` =
  `tree_of_thought` (system + question, `fork(3)` plans, `join`, `select` judge) over K
  problems with `run_batch`, ``react`` = `react_agent` (thought gen, action `select`,
  calculator between gens, up to 3 steps) over K questions with `run_batch`.
* Configurations, one fresh in-process Engine each (bundled SmolLM2-135M, float32, CPU,
  ``--threads`` torch threads): ``radix`` (default radix cache) and ``NoCache``
  (``disable_radix_cache=True``). An untimed warm-up request runs first; the cache is
  flushed before each workload.
* Reported per workload and configuration: wall time; programs/s; requests/s (requests
  = prompts sent to the engine, gens + select scoring + prefix commits); prompt tokens;
  prefill tokens computed (scheduler counter: tokens run through extend steps);
  cache hit rate = cached prompt tokens / prompt tokens. Outputs of the two
  configurations are compared (greedy: they must be identical). ``os.getloadavg()`` is
  recorded: on a shared machine compare runs with similar load.

    python benchmarks/dsl_programs.py --quick   # N=8, K=2
    python benchmarks/dsl_programs.py           # N=16, K=4
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine_throughput import machine_info
from report import save_report

import radixlm
from radixlm.lang.backend.engine import EngineBackend

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import few_shot_qa  # noqa: E402
import react_agent  # noqa: E402
import tree_of_thought  # noqa: E402

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "dsl_programs.json"
CONFIGS = {"radix": {}, "NoCache": {"disable_radix_cache": True}}
MORE_QUESTIONS = [
    "What is the capital of Spain?",
    "What color is coal?",
    "What animal barks?",
    "What is the largest ocean?",
    "What season is coldest?",
    "What gas do we breathe?",
    "What fruit is yellow?",
    "What is the capital of Egypt?",
]
PROBLEMS = [
    "How can I keep my houseplants alive while I travel for two weeks?",
    "How can a small team share one car fairly?",
    "How should I prepare for a long hike?",
    "How can I learn a new language in a year?",
]
WORD_PROBLEMS = [
    "A box holds 12 eggs. How many eggs are in 7 boxes?",
    "A train travels 60 km per hour. How far does it go in 3 hours?",
    "Tom has 45 apples and gives away 17. How many are left?",
    "A ticket costs 8 dollars. What do 9 tickets cost?",
]


class CountingBackend(EngineBackend):
    """EngineBackend that counts the prompts it sends (thread-safe)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.requests = 0
        self._count_lock = threading.Lock()

    def _generate(self, text, input_ids, sampling_params, logprob, on_delta, priority=0):
        with self._count_lock:
            self.requests += len(text if text is not None else input_ids)
        return super()._generate(text, input_ids, sampling_params, logprob, on_delta, priority)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--model", default="smollm2-135m", help="radixlm model alias or path")
    add("--threads", type=int, default=1, help="torch threads")
    add("--questions", type=int, default=16, help="N: few-shot questions (<= 16)")
    add("--programs", type=int, default=4, help="K: branching problems and ReAct questions")
    add("--quick", action="store_true", help="smoke run: N=8, K=2")
    add("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON output path")
    args = p.parse_args(argv)
    if args.quick:
        args.questions, args.programs = 8, 2
    return args


def workloads(args: argparse.Namespace) -> dict[str, tuple[Any, list[dict[str, Any]], Any]]:
    """name -> (program, run_batch arguments, function of a state giving its output)."""
    questions = (few_shot_qa.QUESTIONS + MORE_QUESTIONS)[: args.questions]
    k = args.programs
    return {
        "few-shot": (
            few_shot_qa.few_shot_qa,
            [{"question": q} for q in questions],
            lambda s: s["answer"],
        ),
        "branching": (
            tree_of_thought.tree_of_thought,
            [{"problem": p} for p in PROBLEMS[:k]],
            lambda s: (s["plan"], s["best"]),
        ),
        "react": (
            react_agent.react,
            [{"question": q} for q in WORD_PROBLEMS[:k]],
            lambda s: s.text(),
        ),
    }


def counters(backend: EngineBackend) -> dict[str, int]:
    stats = backend.get_server_info()["scheduler"]
    return {
        k: stats[k] for k in ("prompt_tokens_total", "cached_tokens_total", "prefill_tokens_total")
    }


def run_config(name: str, overrides: dict[str, Any], args) -> tuple[dict, dict]:
    engine = radixlm.Engine(
        model=args.model, num_threads=args.threads, max_total_tokens=32768, **overrides
    )
    backend = CountingBackend(engine)
    backend.engine_call(lambda e: e.generate("Warm up the kernels.", {"max_new_tokens": 4}))
    rows, outputs = {}, {}
    for wname, (program, batch, output) in workloads(args).items():
        backend.flush_cache()
        before, requests = counters(backend), backend.requests
        start = time.perf_counter()
        states = program.run_batch(batch, backend=backend, temperature=0)
        wall = time.perf_counter() - start
        errors = [repr(s.error()) for s in states if s.error() is not None]
        if errors:
            raise RuntimeError(f"{wname} / {name}: {errors[0]}")
        after = counters(backend)
        d = {k: after[k] - before[k] for k in after}
        n_req = backend.requests - requests
        rows[wname] = {
            "programs": len(batch),
            "requests": n_req,
            "wall_s": round(wall, 3),
            "programs_per_s": round(len(batch) / wall, 3),
            "requests_per_s": round(n_req / wall, 3),
            "prompt_tokens": d["prompt_tokens_total"],
            "prefill_tokens": d["prefill_tokens_total"],
            "cache_hit_rate": round(d["cached_tokens_total"] / max(1, d["prompt_tokens_total"]), 4),
        }
        outputs[wname] = [output(s) for s in states]
        print(f"{name:8s} {wname:10s} {rows[wname]}", file=sys.stderr)
    engine.shutdown()
    return rows, outputs


def print_table(results: dict[str, dict[str, dict]]) -> None:
    header = (
        f"{'workload':10s} {'config':8s} {'req':>5s} {'req/s':>7s} {'prog/s':>7s} "
        f"{'prompt tok':>10s} {'prefill tok':>11s} {'hit rate':>8s} {'wall s':>7s}"
    )
    print(header)
    print("-" * len(header))
    for wname in next(iter(results.values())):
        for cname, rows in results.items():
            r = rows[wname]
            print(
                f"{wname:10s} {cname:8s} {r['requests']:5d} {r['requests_per_s']:7.2f} "
                f"{r['programs_per_s']:7.2f} {r['prompt_tokens']:10d} {r['prefill_tokens']:11d} "
                f"{r['cache_hit_rate']:8.1%} {r['wall_s']:7.1f}"
            )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results, outputs = {}, {}
    for name, overrides in CONFIGS.items():
        results[name], outputs[name] = run_config(name, overrides, args)
    identical = {w: outputs["radix"][w] == outputs["NoCache"][w] for w in outputs["radix"]}
    print_table(results)
    print(f"greedy outputs identical with and without the cache: {identical}")
    report = {
        "benchmark": "dsl_programs",
        "args": vars(args),
        "machine": machine_info(),
        "loadavg": os.getloadavg(),
        "results": results,
        "outputs_identical": identical,
    }
    save_report(report, args.output)
    return report


if __name__ == "__main__":
    main()
