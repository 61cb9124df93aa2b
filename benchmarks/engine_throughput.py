"""Decode and prefill throughput of `radixlm.Engine` against `transformers` generate.

Both engines run in the same process, on the same model weights (the bundled
SmolLM2-135M-Instruct, dequantized to float32 on CPU), with the same thread count
(``torch.set_num_threads(--threads)``, default 1) and the same prompts as token ids.

Method
------
* Prompts are random token ids (fixed ``--seed``; special tokens excluded). Every prompt
  in the run starts with a different token, and every measurement uses a fresh prompt
  set, so radixlm's prefix cache can never hit (the reported ``cached_tokens`` must be 0;
  ``--disable-radix-cache`` turns the cache off altogether).
* Greedy decoding, EOS ignored: radixlm gets ``ignore_eos=True``; transformers runs
  with ``eos_token_id`` unset on the model's generation config, so both always emit
  exactly ``max_new_tokens`` tokens (checked).
* transformers: one static batch, prompts left-padded with an attention mask
  (``AutoModelForCausalLM.generate(do_sample=False)``, KV cache on).
* Decode test at batch B (``--batch-sizes``, default 1 8 32): B prompts of
  ``--prompt-tokens`` (32) tokens are generated twice on fresh prompt sets, once with
  ``max_new_tokens=1`` (prefill plus the first token: t_1) and once with
  ``max_new_tokens=N`` (``--decode-tokens``, 64: t_N). Then

      decode tokens/s = B * (N - 1) / (t_N - t_1)

  i.e. the steady-state decode rate with the prefill and first token excluded. The
  end-to-end rate B * N / t_N is recorded in the JSON too.
* Prefill test: ``--prefill-prompts`` (4) prompts of ``--prefill-tokens`` (512) tokens
  in one batch with ``max_new_tokens=1``; prefill tokens/s = prompt tokens / wall time.
* Each repeat (``--repeats``, 3) runs every test on radixlm then transformers
  (A-B-A-B...); the table shows median [min-max] over repeats and the ratio of
  medians radixlm / transformers (> 1: radixlm is faster). One untimed warm-up per
  engine runs first. ``os.getloadavg()`` is recorded before and after the run and
  around every measurement: on a shared machine, compare runs with similar load.

Output: a table on stdout and JSON at ``--output``
(default ``benchmarks/results/engine_throughput.json``) with the machine, versions,
settings, definitions, summaries and every raw measurement.

    python benchmarks/engine_throughput.py --quick     # smoke run: batch 1 and 8, 1 repeat
    python benchmarks/engine_throughput.py             # full run
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch
from report import save_report

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "engine_throughput.json"
FULL = {"batch_sizes": [1, 8, 32], "decode_tokens": 64, "prefill_prompts": 4, "repeats": 3}
QUICK = {"batch_sizes": [1, 8], "decode_tokens": 16, "prefill_prompts": 2, "repeats": 1}
DECODE_DEF = (
    "B*(N-1)/(t_N - t_1): tokens generated after the first"
    " / (wall time for N new tokens - wall time for 1 new token)"
)
PREFILL_DEF = "prompt tokens / wall time of generate(max_new_tokens=1) on one batch"
ENGINES = ("radixlm", "transformers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--model", default="smollm2-135m", help="radixlm model alias or path")
    add("--threads", type=int, default=1, help="torch threads for both engines")
    add("--batch-sizes", type=int, nargs="+", help="decode batch sizes (default 1 8 32)")
    add("--prompt-tokens", type=int, default=32, help="prompt length of decode tests")
    add("--decode-tokens", type=int, help="new tokens N per decode test (default 64)")
    add("--prefill-tokens", type=int, default=512, help="prompt length of the prefill test")
    add("--prefill-prompts", type=int, help="prompts in the prefill batch (default 4)")
    add("--repeats", type=int, help="A-B repetitions (default 3)")
    add("--seed", type=int, default=0, help="prompt RNG seed")
    add("--max-total-tokens", type=int, help="radixlm KV pool (default: 2x the largest test)")
    add("--disable-radix-cache", action="store_true", help="radixlm without a prefix cache")
    add("--quick", action="store_true", help="smoke run: batch 1 and 8, N=16, 1 repeat")
    add("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON output path")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.decode_tokens < 2:
        p.error("--decode-tokens must be >= 2")
    return args


class PromptFactory:
    """Random token-id prompts; no two prompts of the run share their first token."""

    def __init__(self, seed: int, vocab_size: int, special_ids: list[int]):
        self.rng = random.Random(seed)
        special = set(special_ids)
        self.pool = [t for t in range(vocab_size) if t not in special]
        self.firsts = self.pool[:]
        self.rng.shuffle(self.firsts)

    def batch(self, n: int, length: int) -> list[list[int]]:
        if len(self.firsts) < n:
            raise RuntimeError("ran out of unique first tokens")
        return [[self.firsts.pop()] + self.rng.choices(self.pool, k=length - 1) for _ in range(n)]


class RadixRunner:
    name = "radixlm"

    def __init__(self, args: argparse.Namespace, max_total_tokens: int):
        from radixlm import Engine

        self.llm = Engine(
            args.model,
            max_total_tokens=max_total_tokens,
            num_threads=args.threads,
            disable_radix_cache=args.disable_radix_cache,
        )

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]], int]:
        params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        start = time.perf_counter()
        outs = self.llm.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - start
        cached = sum(o["usage"]["cached_tokens"] for o in outs)
        return elapsed, [o["output_ids"] for o in outs], cached


class HFRunner:
    name = "transformers"

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        from radixlm.runtime.executor.model_registry import local_hf_dir

        hf_dir = local_hf_dir(args.model)
        self.tokenizer = AutoTokenizer.from_pretrained(hf_dir)
        self.model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        # A None in the per-call config would be filled from the model's own config,
        # so EOS is removed there: generation then always runs to max_new_tokens.
        self.model.generation_config.eos_token_id = None
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else 0
        self.config_cls = GenerationConfig

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]], int]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        gen = self.config_cls(
            do_sample=False, max_new_tokens=new_tokens, pad_token_id=self.pad_id, use_cache=True
        )
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        elapsed = time.perf_counter() - start
        return elapsed, out[:, width:].tolist(), 0


def timed(runner, prompts: list[list[int]], new_tokens: int, threads: int) -> dict[str, Any]:
    """One measurement; checks every request produced exactly `new_tokens` tokens."""
    torch.set_num_threads(threads)
    gc.collect()
    load_before = os.getloadavg()
    elapsed, outputs, cached = runner.run(prompts, new_tokens)
    bad = [len(o) for o in outputs if len(o) != new_tokens]
    if bad:
        raise RuntimeError(f"{runner.name}: expected {new_tokens} new tokens, got lengths {bad}")
    return {
        "seconds": elapsed,
        "outputs": outputs,
        "cached_tokens": cached,
        "loadavg": [load_before[0], os.getloadavg()[0]],
    }


def summarize(values: list[float]) -> dict[str, Any]:
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values), "runs": values}


def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "git_commit": commit,
    }


def measure(runner, kind: str, b: int, prompts: dict, args: argparse.Namespace) -> dict:
    """One engine on one test: the rate in tokens/s plus raw timings."""
    n_new = args.decode_tokens
    if kind == "decode":
        t1 = timed(runner, prompts["ref"], 1, args.threads)
        tn = timed(runner, prompts["main"], n_new, args.threads)
        steps = tn["seconds"] - t1["seconds"]
        rec = {
            "tok_s": b * (n_new - 1) / steps,
            "t_1": t1["seconds"],
            "t_N": tn["seconds"],
            "end_to_end_tok_s": b * n_new / tn["seconds"],
            "ms_per_step": 1000 * steps / (n_new - 1),
            "cached_tokens": t1["cached_tokens"] + tn["cached_tokens"],
            "loadavg": [t1["loadavg"][0], tn["loadavg"][1]],
        }
    else:
        tn = timed(runner, prompts["main"], 1, args.threads)
        rec = {
            "tok_s": b * args.prefill_tokens / tn["seconds"],
            "seconds": tn["seconds"],
            "cached_tokens": tn["cached_tokens"],
            "loadavg": tn["loadavg"],
        }
    rec["outputs"] = tn["outputs"]
    return rec


def run_tests(args: argparse.Namespace, runners: list, factory: PromptFactory) -> list[dict]:
    """Every repeat runs every test on each engine in turn (A-B-A-B); returns raw records."""
    tests = [("decode", b) for b in args.batch_sizes] + [("prefill", args.prefill_prompts)]
    raw = []
    for rep in range(args.repeats):
        for kind, b in tests:
            length = args.prompt_tokens if kind == "decode" else args.prefill_tokens
            prompts = {"main": factory.batch(b, length)}
            if kind == "decode":
                prompts["ref"] = factory.batch(b, length)
            outs = {}
            for r in runners:
                rec = measure(r, kind, b, prompts, args)
                outs[r.name] = rec.pop("outputs")
                raw.append({"repeat": rep, "test": kind, "batch_size": b, "engine": r.name, **rec})
                print(
                    f"  repeat {rep} {kind:7s} b={b:<3d} {r.name:12s} {rec['tok_s']:9.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
            pairs = zip(outs["radixlm"], outs["transformers"], strict=True)
            raw[-1]["identical_outputs_fraction"] = sum(a == c for a, c in pairs) / b
    return raw


def summarize_results(args: argparse.Namespace, raw: list[dict]) -> list[dict]:
    tests = dict.fromkeys((r["test"], r["batch_size"]) for r in raw)
    results = []
    for kind, b in tests:
        rows = [r for r in raw if (r["test"], r["batch_size"]) == (kind, b)]
        same = [r["identical_outputs_fraction"] for r in rows if "identical_outputs_fraction" in r]
        decode = kind == "decode"
        row = {
            "test": kind,
            "batch_size": b,
            "prompt_tokens": args.prompt_tokens if decode else args.prefill_tokens,
            "new_tokens": args.decode_tokens if decode else 1,
            "metric": "decode tokens/s" if decode else "prefill tokens/s",
            "definition": DECODE_DEF if decode else PREFILL_DEF,
            "greedy_outputs_identical_fraction": statistics.mean(same),
        }
        for name in ENGINES:
            row[name] = summarize([r["tok_s"] for r in rows if r["engine"] == name])
        row["ratio_radixlm_over_transformers"] = (
            row["radixlm"]["median"] / row["transformers"]["median"]
        )
        results.append(row)
    return results


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    import transformers

    torch.set_num_threads(args.threads)
    loadavg_before = os.getloadavg()
    biggest = max(
        max(args.batch_sizes) * (args.prompt_tokens + args.decode_tokens),
        args.prefill_prompts * (args.prefill_tokens + 1),
    )
    max_total = args.max_total_tokens or 2 * biggest
    hf = HFRunner(args)
    rl = RadixRunner(args, max_total)
    runners = [rl, hf]  # the A-B order of every test
    factory = PromptFactory(args.seed, hf.model.config.vocab_size, hf.tokenizer.all_special_ids)
    warm = factory.batch(max(args.batch_sizes), args.prompt_tokens)
    for r in runners:  # untimed: first-call allocations and lazy initialisation
        timed(r, warm, 2, args.threads)

    raw = run_tests(args, runners, factory)
    info = rl.llm.get_server_info()
    rl.llm.shutdown()
    engine_keys = ("kv_bytes_per_token", "max_total_tokens", "weights_bytes", "page_size")
    settings = {
        k: getattr(args, k)
        for k in (
            "model",
            "threads",
            "batch_sizes",
            "prompt_tokens",
            "decode_tokens",
            "prefill_tokens",
            "prefill_prompts",
            "repeats",
            "seed",
            "disable_radix_cache",
        )
    }
    settings.update(
        dtype="float32",
        device="cpu",
        max_total_tokens=max_total,
        order="per repeat and test: radixlm then transformers",
        sampling="greedy, EOS ignored",
    )
    return {
        "benchmark": "engine_throughput",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "machine": machine_info(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "settings": settings,
        "definitions": {
            "decode_tok_s": DECODE_DEF,
            "prefill_tok_s": PREFILL_DEF,
            "ratio": "median radixlm / median transformers (> 1: radixlm faster)",
        },
        "radixlm_engine": {k: info[k] for k in engine_keys},
        "loadavg_before": list(loadavg_before),
        "loadavg_after": list(os.getloadavg()),
        "results": summarize_results(args, raw),
        "raw": raw,
    }


def format_table(report: dict[str, Any]) -> str:
    s, m = report["settings"], report["machine"]
    lines = [
        f"radixlm vs transformers: {s['model']} {s['dtype']} {s['device']}, "
        f"{s['threads']} thread(s), {s['repeats']} repeat(s); tok/s as median [min-max]",
        f"decode tok/s = {DECODE_DEF}",
        f"  (B prompts of {s['prompt_tokens']} tokens, N = {s['decode_tokens']})",
        f"prefill tok/s = {PREFILL_DEF} ({s['prefill_prompts']} x {s['prefill_tokens']} tokens)",
        "",
        f"{'test':<14}{'radixlm':>24}{'transformers':>24}{'ratio':>8}{'same out':>10}",
    ]
    for row in report["results"]:
        cells = [
            f"{row[n]['median']:.1f} [{row[n]['min']:.1f}-{row[n]['max']:.1f}]" for n in ENGINES
        ]
        label = f"{row['test']} b={row['batch_size']}"
        lines.append(
            f"{label:<14}{cells[0]:>24}{cells[1]:>24}"
            f"{row['ratio_radixlm_over_transformers']:>8.2f}"
            f"{row['greedy_outputs_identical_fraction']:>10.2f}"
        )
    lb, la = (" ".join(f"{x:.2f}" for x in report[k]) for k in ("loadavg_before", "loadavg_after"))
    lines += [
        "",
        f"loadavg before {lb}, after {la}; {m['logical_cpus']} CPUs ({m['cpu']})",
        "ratio = radixlm / transformers medians; same out = fraction of requests with",
        "identical greedy tokens in both engines (mean over repeats)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_benchmark(args)
    cached = sum(r["cached_tokens"] for r in report["raw"])
    if cached:
        print(f"warning: radixlm reported {cached} cached tokens", file=sys.stderr)
    print(format_table(report))
    save_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
