"""Decode-step time of radixlm's CPU paths, side by side in one process.

* ``torch``: torch's GEMM (`--cpu-gemm torch`) and the torch_native attention backend;
* ``packed``: fp32 packed weight panels and the C kernels, each module called from Python;
* ``fused``: as ``packed``, and all the decoder layers of a decode step run as one C call
  (`FusedDecodeStack`): the default for fp32 weights (`--weight-format fp32`);
* ``gguf``: the default for the bundled GGUF: as ``fused``, on the file's Q4_1 / Q8_0
  blocks kept as quantized panels (the same weight values).

Three engines (``torch``, fp32 and gguf) share the process; ``packed`` is the fp32
engine with its layers run in order (`run_in_order`) instead of the fused stack.
Variants alternate within every repetition (A B C, then C B A, ...) so machine noise
hits them alike. Each run greedily decodes `--new-tokens` tokens for B prompts of
`--prompt-len` tokens; the decode-step time is the model forward of every step after the
first two. Greedy tokens must be equal across paths. Prints a markdown table and writes
JSON (default `benchmarks/results/cpu_decode.json`).

    python benchmarks/cpu_decode.py --threads 1 2 --batches 1 4 16
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

VARIANTS = ("torch", "packed", "fused", "gguf")
#: Variant -> the engine it runs on.
ENGINE_OF = {"torch": "torch", "packed": "fp32", "fused": "fp32", "gguf": "gguf"}


def _timed(engine: Engine, times: list[float]) -> None:
    model = engine.runner.model
    forward = model.forward

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = forward(*args, **kwargs)
        times.append(time.perf_counter() - t0)
        return out

    model.forward = timed


def run(threads: int, batches: list[int], reps: int, prompt_len: int, new: int) -> list[dict]:
    """Rows of {threads, batch, <variant>_ms, tokens_identical} (median step, ms)."""
    times: list[float] = []
    engines = {
        "torch": Engine(
            num_threads=threads,
            max_total_tokens=8192,
            cpu_gemm="torch",
            attention_backend="torch_native",
        ),  # fmt: skip
        "fp32": Engine(num_threads=threads, max_total_tokens=8192, weight_format="fp32"),
        "gguf": Engine(num_threads=threads, max_total_tokens=8192, weight_format="gguf"),
    }
    for engine in engines.values():
        _timed(engine, times)
    inner = engines["fp32"].runner.model.model
    fused_stack = inner.run_layers
    steps: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[int, int], dict[str, list]] = {}
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    try:
        for rep in range(reps):
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                inner.run_layers = fused_stack if variant == "fused" else run_in_order
                engine = engines[ENGINE_OF[variant]]
                for b in batches:
                    prompts = [[100 + 7 * i + j + rep for j in range(prompt_len)] for i in range(b)]
                    times.clear()
                    outs = engine.generate(input_ids=prompts, sampling_params=params)
                    steps.setdefault((variant, b), []).extend(times[2:])
                    outputs.setdefault((rep, b), {})[variant] = [o["output_ids"] for o in outs]
    finally:
        for engine in engines.values():
            engine.shutdown()
    rows = []
    for b in batches:
        same = all(len({str(v) for v in outputs[(r, b)].values()}) == 1 for r in range(reps))
        row = {"threads": threads, "batch": b, "tokens_identical": same}
        for variant in VARIANTS:
            row[f"{variant}_ms"] = statistics.median(steps[(variant, b)]) * 1e3
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="(default 1 2)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16], help="(default 1 4 16)")
    ap.add_argument("--reps", type=int, default=4, help="alternated repetitions (default 4)")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
    ap.add_argument("--new-tokens", type=int, default=24, help="decoded tokens (default 24)")
    ap.add_argument("--output", default="benchmarks/results/cpu_decode.json", help="JSON path")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rows = [
        row
        for t in args.threads
        for row in run(t, args.batches, args.reps, args.prompt_len, args.new_tokens)
    ]
    lines = [
        "| threads | batch | torch ms | packed ms | fused ms | gguf ms | torch / fused "
        "| fused / gguf | tokens equal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['batch']} | {r['torch_ms']:.1f} | {r['packed_ms']:.1f} | "
            f"{r['fused_ms']:.1f} | {r['gguf_ms']:.1f} | {r['torch_ms'] / r['fused_ms']:.2f}x | "
            f"{r['fused_ms'] / r['gguf_ms']:.2f}x | {r['tokens_identical']} |"
        )
    print("\n".join(lines))
    report = {
        "args": vars(args),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "torch": torch.__version__,
        "rows": rows,
        "markdown": "\n".join(lines),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
