"""Decode-step time of SmolLM2-135M on CPU by KV cache dtype (`--kv-cache-dtype`).

Variants, each an engine of the bundled model (GGUF weights, radixlm's C kernels):

* ``float32``, ``float16``: the fused decode stack (every layer of a step in one C call);
* ``float32-in-order``: the float32 engine with its layers run one by one
  (`run_in_order`), the way fp8 pools run (the fused stack has no fp8 store);
* ``fp8_e4m3``, ``fp8_e5m2``: the fp8 pool, C attention kernels reading fp8.

Variants alternate within every repetition (forward, then reversed) so machine noise hits
them alike. Each run greedily decodes `--new-tokens` tokens for B prompts of
`--prompt-len` tokens; the step time is the model forward of every decode step after the
first two (median). Prints a markdown table with KV bytes per token and the tokens that
agree with float32's, and writes JSON (default `benchmarks/results/kv_cache_dtype.json`).

    python benchmarks/kv_cache_dtype.py --batches 1 32 --prompt-len 256
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch

from radixlm import Engine
from radixlm.runtime.executor.layers.blocks import run_in_order

VARIANTS = ("float32", "float32-in-order", "float16", "fp8_e4m3", "fp8_e5m2")
#: Variant -> the engine (its --kv-cache-dtype) it runs on.
ENGINE_OF = {v: v.removesuffix("-in-order") for v in VARIANTS}


def _timed(engine: Engine, times: list[float]) -> None:
    model = engine.runner.model
    forward = model.forward

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = forward(*args, **kwargs)
        times.append(time.perf_counter() - t0)
        return out

    model.forward = timed


def _agree(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run(threads: int, batches: list[int], reps: int, prompt_len: int, new: int) -> list[dict]:
    """Rows of {batch, <variant>_ms, <variant>_agree} (median step ms; mean tokens equal
    to float32's before the first difference)."""
    times: list[float] = []
    tokens = max(batches) * (prompt_len + new + 8)
    engines = {
        kv: Engine(num_threads=threads, max_total_tokens=tokens, kv_cache_dtype=kv)
        for kv in dict.fromkeys(ENGINE_OF.values())
    }
    for engine in engines.values():
        _timed(engine, times)
    inner = engines["float32"].runner.model.model
    fused_stack = inner.run_layers
    steps: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    try:
        for rep in range(reps):
            for variant in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
                inner.run_layers = run_in_order if variant.endswith("in-order") else fused_stack
                engine = engines[ENGINE_OF[variant]]
                for b in batches:
                    prompts = [[100 + 7 * i + j for j in range(prompt_len)] for i in range(b)]
                    times.clear()
                    engine.flush_cache()
                    outs = engine.generate(input_ids=prompts, sampling_params=params)
                    steps.setdefault((variant, b), []).extend(times[2:])
                    outputs[variant, b] = [o["output_ids"] for o in outs]
        bpt = {kv: e.get_server_info()["kv_bytes_per_token"] for kv, e in engines.items()}
    finally:
        for engine in engines.values():
            engine.shutdown()
    rows = []
    for b in batches:
        row: dict = {"threads": threads, "batch": b}
        for variant in VARIANTS:
            row[f"{variant}_ms"] = statistics.median(steps[(variant, b)]) * 1e3
            pairs = zip(outputs[variant, b], outputs["float32", b])
            row[f"{variant}_agree"] = statistics.mean(_agree(x, y) for x, y in pairs)
            row[f"{variant}_kv_bytes_per_token"] = bpt[ENGINE_OF[variant]]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="(default 1)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="(default 1 32)")
    ap.add_argument("--reps", type=int, default=2, help="alternated repetitions (default 2)")
    ap.add_argument("--prompt-len", type=int, default=256, help="prompt tokens (default 256)")
    ap.add_argument("--new-tokens", type=int, default=12, help="decoded tokens (default 12)")
    ap.add_argument("--output", default="benchmarks/results/kv_cache_dtype.json", help="JSON path")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rows = run(args.threads, args.batches, args.reps, args.prompt_len, args.new_tokens)
    head = " | ".join(f"{v} ms" for v in VARIANTS)
    lines = [f"| batch | {head} | KV B/token (f32 / f16 / fp8) | tokens = float32's |"]
    lines.append("|---" * (len(VARIANTS) + 3) + "|")
    for r in rows:
        ms = " | ".join(f"{r[f'{v}_ms']:.1f}" for v in VARIANTS)
        bpt = " / ".join(
            str(r[f"{v}_kv_bytes_per_token"]) for v in ("float32", "float16", "fp8_e4m3")
        )
        agree = ", ".join(f"{v} {r[f'{v}_agree']:.1f}" for v in VARIANTS[2:])
        lines.append(f"| {r['batch']} | {ms} | {bpt} | {agree} of {args.new_tokens} |")
    print("\n".join(lines))
    report = {
        "args": vars(args),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "torch": torch.__version__,
        "cpu": _cpu_name(),
        "rows": rows,
        "markdown": "\n".join(lines),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.output}")
    return 0


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or 'unknown'."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
