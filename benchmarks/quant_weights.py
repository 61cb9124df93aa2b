"""Decode-step time and weight bytes of the bundled SmolLM2-135M as quantized checkpoints
on radixlm's packed CPU layout: fp32, compressed-tensors W4A16 (asymmetric, G=32 / G=64 /
per-channel; G=128 does not divide SmolLM2's hidden size 576 and fails at load) and W8A8
int8 / fp8, written by the test-side writers (tests/quant_checkpoints.py, needs
`compressed-tensors`). Engines run one at a time; each greedily decodes `--new-tokens`
tokens for B prompts of `--prompt-len` tokens, and the decode step is the median model
forward after the first two steps. Prints a markdown table and writes JSON (default
`benchmarks/results/quant_weights.json`).

    python benchmarks/quant_weights.py --batches 1 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy)

# isort: split
from radixlm import Engine
from radixlm.runtime.executor.model_registry import local_hf_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.quant_checkpoints import write_compressed_tensors  # noqa: E402

VARIANTS = {
    "fp32": None,
    "w4a16-g32": ("w4a16_asym", 32),
    "w4a16-g64": ("w4a16_asym", 64),
    "w4a16-channel": ("w4a16_asym", -1),
    "w8a8-int8": ("w8a8_int8", 32),
    "w8a8-fp8 (weight-only on CPU)": ("w8a8_fp8", 32),
}


def measure(path: Path, batches: list[int], prompt_len: int, new: int, threads: int) -> dict:
    times: list[float] = []
    with Engine(str(path), num_threads=threads, max_total_tokens=8192) as engine:
        model = engine.runner.model
        forward = model.forward

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            times.append(time.perf_counter() - t0)
            return out

        model.forward = timed
        row = {"weight_bytes": engine.runner.weights_bytes}
        info = engine.get_server_info()["resolved"]
        row["weight_format"], row["quantized"] = info["weight_format"], info["quantized_weights"]
        params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
        for b in batches:
            prompts = [[100 + 7 * i + j for j in range(prompt_len)] for i in range(b)]
            times.clear()
            engine.generate(input_ids=prompts, sampling_params=params)
            row[f"b{b}_ms"] = statistics.median(times[2:]) * 1e3
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/quant_weights.json")
    args = p.parse_args(argv)
    hf = local_hf_dir("smollm2-135m")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in VARIANTS.items():
            path = hf
            if spec is not None:
                path = Path(tmp) / name.split()[0]
                write_compressed_tensors(hf, path, spec[0], spec[1])
            rows[name] = measure(path, args.batches, args.prompt_len, args.new_tokens, args.threads)
            print(name, rows[name], flush=True)
    head = "| weights | format | weight MB | " + " | ".join(f"step B={b} ms" for b in args.batches)
    print(head + " |\n|" + "---|" * (3 + len(args.batches)))
    for name, r in rows.items():
        steps = " | ".join(f"{r[f'b{b}_ms']:.1f}" for b in args.batches)
        print(f"| {name} | {r['weight_format']} | {r['weight_bytes'] / 1e6:.1f} | {steps} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
