"""What radixlm's radix prefix cache buys on agent-style (shared-prefix) traffic.

Three engines run in one process on the same weights (the bundled SmolLM2-135M-Instruct,
float32 on CPU) with the same thread count (``torch.set_num_threads(--threads)``, 1):
radixlm with its radix cache, radixlm with ``disable_radix_cache=True``, and
``transformers`` ``AutoModelForCausalLM.generate``.

Method
------
* Workload "generated-shared-prefix": G groups (``--groups``, 4) x P prompts
  (``--prompts-per-group``, 8). Each group has a system prompt of S random token ids
  (``--system-tokens``, 512) followed, per prompt, by a unique question of Q random ids
  (``--question-tokens``, 32). Fixed ``--seed``, special tokens excluded, every system
  prompt starts with a different token. The same prompts are used in every repeat.
* Greedy, EOS ignored, ``--max-new-tokens`` M (8) per request (checked): radixlm gets
  ``ignore_eos=True``; transformers runs with ``generation_config.eos_token_id = None``.
* radixlm: all G*P prompts go in one ``generate`` call (token ids). transformers: one
  static batch per group (left padding, attention mask, KV cache on), timed together.
* Each repeat (``--repeats``, 3) runs radixlm+cache, radixlm no-cache, transformers in
  that order. A radixlm engine is created fresh per repeat (untimed, with an untimed
  warm-up on unrelated prompts), then the workload is submitted twice: "cold" = first
  submission on the fresh engine, "warm" = the same prompts again (their KV may now be
  in the cache). transformers has no cross-call cache: cold and warm are two plain calls.
* Per pass: wall time, prompt tokens, cached tokens (radixlm ``usage.cached_tokens``),
  prefilled = prompt - cached, hit rate = cached / prompt, and throughput =
  (prompt + output tokens) / wall time. The table shows median [min-max] over repeats;
  ratios are of throughput medians. ``same out`` = fraction of requests whose greedy
  tokens are identical in all three engines. ``os.getloadavg()`` is recorded around
  every pass: on a shared machine, compare runs with similar load.
* For reference the JSON also gives the hit rate a cache reaching each system prompt
  after its first request would get when cold, (P-1)/P * S/(S+Q), and the warm bound
  (S+Q-1)/(S+Q) (the last prompt token is always recomputed).

Output: a table on stdout and JSON at ``--output``
(default ``benchmarks/results/prefix_cache.json``).

    python benchmarks/prefix_cache.py --quick   # smoke run: G=2, P=4, S=256, 1 repeat
    python benchmarks/prefix_cache.py           # full run
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch
from engine_throughput import HFRunner, machine_info, summarize
from report import save_report

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "prefix_cache.json"
FULL = {"groups": 4, "prompts_per_group": 8, "system_tokens": 512, "repeats": 3}
QUICK = {"groups": 2, "prompts_per_group": 4, "system_tokens": 256, "repeats": 1}
ENGINES = ("radixlm+cache", "radixlm no-cache", "transformers")
PASSES = ("cold", "warm")
TPUT_DEF = "(prompt + output tokens) / wall time of the whole workload"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--model", default="smollm2-135m", help="radixlm model alias or path")
    add("--threads", type=int, default=1, help="torch threads for all engines")
    add("--groups", type=int, help="G: groups sharing a system prompt (default 4)")
    add("--prompts-per-group", type=int, help="P: prompts per group (default 8)")
    add("--system-tokens", type=int, help="S: shared system prompt tokens (default 512)")
    add("--question-tokens", type=int, default=32, help="Q: unique question tokens")
    add("--max-new-tokens", type=int, default=8, help="M: new tokens per request")
    add("--repeats", type=int, help="repetitions (default 3)")
    add("--seed", type=int, default=0, help="prompt RNG seed")
    add("--max-total-tokens", type=int, help="radixlm KV pool (default: G*P*(S+Q+M)+1024)")
    add("--quick", action="store_true", help="smoke run: G=2, P=4, S=256, 1 repeat")
    add("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON output path")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def make_prompts(args, vocab_size: int, special_ids: list[int]) -> tuple[list, list]:
    """G*P workload prompts (group-major) and 2 unrelated warm-up prompts."""
    rng = random.Random(args.seed)
    special = set(special_ids)
    pool = [t for t in range(vocab_size) if t not in special]
    firsts = rng.sample(pool, args.groups + 2)
    prompts = []
    for g in range(args.groups):
        system = [firsts[g]] + rng.choices(pool, k=args.system_tokens - 1)
        for _ in range(args.prompts_per_group):
            prompts.append(system + rng.choices(pool, k=args.question_tokens))
    warmup = [[f] + rng.choices(pool, k=15) for f in firsts[args.groups :]]
    return prompts, warmup


class RadixRunner:
    def __init__(self, args, cache: bool, max_total_tokens: int):
        from radixlm import Engine

        self.name = "radixlm+cache" if cache else "radixlm no-cache"
        self.llm = Engine(
            args.model,
            max_total_tokens=max_total_tokens,
            num_threads=args.threads,
            disable_radix_cache=not cache,
            log_level="warning",
        )

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], int]:
        params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        outs = self.llm.generate(input_ids=prompts, sampling_params=params)
        return [o["output_ids"] for o in outs], sum(o["usage"]["cached_tokens"] for o in outs)


def run_pass(runner, prompts, args, rep: int, pass_name: str) -> tuple[dict, list]:
    """One timed submission of the workload; transformers gets one batch per group."""
    torch.set_num_threads(args.threads)
    gc.collect()
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    if isinstance(runner, HFRunner):
        outputs, per = [], args.prompts_per_group
        for g in range(args.groups):
            outputs += runner.run(prompts[g * per : (g + 1) * per], args.max_new_tokens)[1]
        cached = 0
    else:
        outputs, cached = runner.run(prompts, args.max_new_tokens)
    seconds = time.perf_counter() - start
    bad = [len(o) for o in outputs if len(o) != args.max_new_tokens]
    if bad:
        raise RuntimeError(f"{runner.name}: expected {args.max_new_tokens} tokens, got {bad}")
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = len(prompts) * args.max_new_tokens
    rec = {
        "repeat": rep,
        "engine": runner.name,
        "pass": pass_name,
        "seconds": seconds,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "prefilled_tokens": prompt_tokens - cached,
        "hit_rate": cached / prompt_tokens,
        "tok_s": (prompt_tokens + output_tokens) / seconds,
        "loadavg": [load_before, os.getloadavg()[0]],
    }
    if not isinstance(runner, HFRunner):
        rec["kv_pool"] = runner.llm.get_server_info()["memory"]
    print(
        f"  repeat {rep} {runner.name:16s} {pass_name}: {seconds:7.2f} s, "
        f"{rec['tok_s']:7.1f} tok/s, cached {cached}/{prompt_tokens}",
        file=sys.stderr,
        flush=True,
    )
    return rec, outputs


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    import transformers

    torch.set_num_threads(args.threads)
    loadavg_before = os.getloadavg()
    G, P, S, Q, M = (
        args.groups,
        args.prompts_per_group,
        args.system_tokens,
        args.question_tokens,
        args.max_new_tokens,
    )
    max_total = args.max_total_tokens or G * P * (S + Q + M) + 1024
    hf = HFRunner(args)
    prompts, warmup = make_prompts(args, hf.model.config.vocab_size, hf.tokenizer.all_special_ids)
    hf.run(warmup, 2)  # untimed: first-call allocations
    raw, outs, same_warm_cold = [], {}, []
    same_out: dict[str, list[float]] = {p: [] for p in PASSES}
    for rep in range(args.repeats):
        for engine in ENGINES:
            if engine == "transformers":
                runner = hf
            else:
                runner = RadixRunner(args, engine == "radixlm+cache", max_total)
                runner.run(warmup, 2)  # untimed; unrelated first tokens: never matched
            for pass_name in PASSES:
                rec, outs[engine, pass_name] = run_pass(runner, prompts, args, rep, pass_name)
                raw.append(rec)
            same_warm_cold.append(outs[engine, "cold"] == outs[engine, "warm"])
            if runner is not hf:
                info = runner.llm.get_server_info()
                runner.llm.shutdown()
                del runner
        for pass_name in PASSES:
            triples = zip(*(outs[e, pass_name] for e in ENGINES), strict=True)
            same_out[pass_name].append(sum(a == b == c for a, b, c in triples) / len(prompts))

    results = []
    for pass_name in PASSES:
        row: dict[str, Any] = {"pass": pass_name}
        for engine in ENGINES:
            rows = [r for r in raw if r["engine"] == engine and r["pass"] == pass_name]
            row[engine] = {
                "tok_s": summarize([r["tok_s"] for r in rows]),
                "seconds": summarize([r["seconds"] for r in rows]),
                **{
                    k: statistics.median(r[k] for r in rows)
                    for k in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "hit_rate")
                },
            }
        med = {e: row[e]["tok_s"]["median"] for e in ENGINES}
        row["ratio_cache_over_nocache"] = med["radixlm+cache"] / med["radixlm no-cache"]
        row["ratio_cache_over_transformers"] = med["radixlm+cache"] / med["transformers"]
        row["greedy_outputs_identical_fraction"] = statistics.mean(same_out[pass_name])
        row["identical_outputs_fraction_per_repeat"] = same_out[pass_name]
        results.append(row)

    settings = {
        k: getattr(args, k)
        for k in (
            "model",
            "threads",
            "groups",
            "prompts_per_group",
            "system_tokens",
            "question_tokens",
            "max_new_tokens",
            "repeats",
            "seed",
        )
    }
    settings.update(
        dtype="float32",
        device="cpu",
        max_total_tokens=max_total,
        order="per repeat: radixlm+cache, radixlm no-cache, transformers; each cold then warm",
        sampling="greedy, EOS ignored",
    )
    return {
        "benchmark": "prefix_cache",
        "workload": "generated-shared-prefix",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "machine": machine_info(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "settings": settings,
        "definitions": {
            "tok_s": TPUT_DEF,
            "prefilled_tokens": "prompt tokens - cached tokens",
            "hit_rate": "cached tokens / prompt tokens",
            "ratio": "median tok/s radixlm+cache / median tok/s of the other engine",
        },
        "reference_hit_rates": {
            "cold_if_prefix_shared_after_first_request": (P - 1) / P * S / (S + Q),
            "warm_upper_bound": (S + Q - 1) / (S + Q),
        },
        "same_outputs_cold_vs_warm_per_engine_run": same_warm_cold,
        "radixlm_engine": {k: info[k] for k in ("kv_bytes_per_token", "page_size")},
        "loadavg_before": list(loadavg_before),
        "loadavg_after": list(os.getloadavg()),
        "results": results,
        "raw": raw,
    }


def format_table(report: dict[str, Any]) -> str:
    s, m, ref = report["settings"], report["machine"], report["reference_hit_rates"]
    lines = [
        f"prefix cache, generated-shared-prefix: G={s['groups']} groups x P="
        f"{s['prompts_per_group']} prompts, S={s['system_tokens']} shared + "
        f"Q={s['question_tokens']} unique tokens, M={s['max_new_tokens']} new",
        f"{s['model']} {s['dtype']} {s['device']}, {s['threads']} thread(s), "
        f"{s['repeats']} repeat(s); median [min-max]; tok/s = {TPUT_DEF}",
        "",
        f"{'engine':<17}{'pass':<6}{'wall s':>22}{'tok/s':>24}"
        f"{'prompt':>8}{'cached':>8}{'prefill':>9}{'hit':>6}",
    ]
    for row in report["results"]:
        for e in ENGINES:
            r = row[e]
            cells = [
                f"{r[k]['median']:.{d}f} [{r[k]['min']:.{d}f}-{r[k]['max']:.{d}f}]"
                for k, d in (("seconds", 2), ("tok_s", 1))
            ]
            lines.append(
                f"{e:<17}{row['pass']:<6}{cells[0]:>22}{cells[1]:>24}{r['prompt_tokens']:>8.0f}"
                f"{r['cached_tokens']:>8.0f}{r['prefilled_tokens']:>9.0f}{r['hit_rate']:>6.2f}"
            )
    lines.append("")
    for row in report["results"]:
        lines.append(
            f"{row['pass']}: cache/no-cache {row['ratio_cache_over_nocache']:.2f}x, "
            f"cache/transformers {row['ratio_cache_over_transformers']:.2f}x, "
            f"same out {row['greedy_outputs_identical_fraction']:.2f}"
        )
    lb, la = (" ".join(f"{x:.2f}" for x in report[k]) for k in ("loadavg_before", "loadavg_after"))
    lines += [
        f"reference hit rate: cold if each prefix were shared after its group's first "
        f"request (P-1)/P*S/(S+Q) = {ref['cold_if_prefix_shared_after_first_request']:.2f}, "
        f"warm bound (S+Q-1)/(S+Q) = {ref['warm_upper_bound']:.2f}",
        "ratios are of tok/s medians; same out = fraction of requests with identical greedy",
        "tokens in all three engines (mean over repeats)",
        f"loadavg before {lb}, after {la}; {m['logical_cpus']} CPUs ({m['cpu']})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_benchmark(args)
    print(format_table(report))
    save_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
