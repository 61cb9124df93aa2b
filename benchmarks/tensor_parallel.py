"""What splitting a model over tensor-parallel ranks costs on this machine: decode step
time and prefill throughput at --tp-size 1 and 2, the share of the step rank 0 spends in
collectives, and the bytes each rank reads per decode step.

The model is a random-weight Llama with SmolLM2-135M's shape except its heads (8 query
heads of 72 dims and 4 KV heads instead of 9 x 64 and 3, so that two ranks split them):
30 layers, hidden 576, MLP 1536, a tied 49152-token vocabulary, fp32. Rows:

* `tp1-packed-2t`: one process, two threads, radixlm's packed C-kernel layout (the
  default);
* `tp1-torch-2t`, `tp1-torch-1t`: one process, torch's GEMM (`--cpu-gemm torch`), the
  layer path the ranks use, so the split is compared with like;
* `tp2-1t-per-rank`: two ranks over gloo, one compute thread each (as many threads in all
  as the 2-thread rows).

Decode step: B requests of a P-token prompt decode N tokens; the step time is
(time of N + 1 tokens - time of 1 token) / N, fresh prompts each repetition. Prefill:
one L-token prompt with one output token, tokens / second. Collectives: rank 0's time
inside all-reduce, gather and the step broadcast during the decode run, over the decode
time (it includes waiting for the slower rank). Bytes per decode step per rank: the
rank's weights (each read once per step) plus its KV bytes per token times the tokens
the batch attends over (mean context).

    python benchmarks/tensor_parallel.py --reps 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import print_table_and_save  # noqa: E402

from radixlm import Engine  # noqa: E402
from radixlm.runtime.executor.model_registry import local_hf_dir  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "tensor_parallel.json"
SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)
#: name -> Engine settings.
ROWS = {
    "tp1-packed-2t": dict(tp_size=1, num_threads=2),
    "tp1-torch-2t": dict(tp_size=1, num_threads=2, cpu_gemm="torch"),
    "tp1-torch-1t": dict(tp_size=1, num_threads=1, cpu_gemm="torch"),
    "tp2-1t-per-rank": dict(tp_size=2, num_threads=1),
}


def save_model(path: Path) -> None:
    """The benchmark's random Llama (seeded) with the bundled tokenizer's files."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE), dtype=torch.float32)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(local_hf_dir("smollm2-135m") / name, path / name)


class CommTimer:
    """Seconds rank 0 spends inside the group's collectives (wraps the group object's
    methods; the layers and the step broadcast call them through it)."""

    def __init__(self, group) -> None:
        self.seconds = 0.0
        for name in ("all_reduce_", "gather_to_first", "broadcast_"):
            setattr(group, name, self._timed(getattr(group, name)))

    def _timed(self, fn):
        def run(*a):
            t0 = time.perf_counter()
            try:
                return fn(*a)
            finally:
                self.seconds += time.perf_counter() - t0

        return run


def _prompts(rng: random.Random, n: int, length: int) -> list[list[int]]:
    return [[rng.randrange(1000, 40000) for _ in range(length)] for _ in range(n)]


def _run(engine, prompts, new: int) -> float:
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    return time.perf_counter() - t0


def measure(path: str, settings: dict, args, rng: random.Random) -> dict:
    """Decode step seconds, prefill tokens/s, collective share and bytes per step of one
    row (medians over `args.reps`)."""
    engine = Engine(path, max_total_tokens=16384, **settings)
    try:
        tp = engine.runner.tp
        timer = CommTimer(tp) if tp is not None else None
        _run(engine, _prompts(rng, args.batch, args.prompt), 2)  # warm up
        steps, prefill, shares = [], [], []
        for _ in range(args.reps):
            one = _run(engine, _prompts(rng, args.batch, args.prompt), 1)
            comm0 = timer.seconds if timer else 0.0
            full = _run(engine, _prompts(rng, args.batch, args.prompt), args.new + 1)
            comm = (timer.seconds - comm0) if timer else 0.0
            steps.append((full - one) / args.new)
            shares.append(comm / full)
            t = _run(engine, _prompts(rng, 1, args.prefill), 1)
            prefill.append(args.prefill / t)
        info = engine.get_server_info()
    finally:
        engine.shutdown()
    context = args.prompt + args.new / 2
    kv_read = info["kv_bytes_per_token"] * context * args.batch
    return {
        "decode_step_ms": statistics.median(steps) * 1e3,
        "prefill_tok_s": statistics.median(prefill),
        "collective_share": statistics.median(shares) if tp is not None else None,
        "weights_bytes_per_rank": info["weights_bytes"],
        "kv_bytes_per_token_per_rank": info["kv_bytes_per_token"],
        "bytes_read_per_step_per_rank": info["weights_bytes"] + kv_read,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8, help="decoding requests")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens of each")
    p.add_argument("--new", type=int, default=32, help="decode steps timed")
    p.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill run")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args()
    load_before = os.getloadavg()
    rng = random.Random(0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        save_model(Path(tmp))
        for name in args.rows.split(","):
            results[name] = measure(tmp, ROWS[name], args, rng)
            print(f"{name}: {results[name]}", file=sys.stderr)
    lines = [
        f"batch {args.batch} x {args.prompt}-token prompts, {args.new} decode steps; "
        f"prefill {args.prefill} tokens; {os.cpu_count()} cores",
        "",
        "| row | decode step ms | prefill tok/s | collectives share | weights MB/rank | "
        "KV B/token/rank | MB read/step/rank |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        share = "-" if r["collective_share"] is None else f"{r['collective_share']:.0%}"
        lines.append(
            f"| {name} | {r['decode_step_ms']:.1f} | {r['prefill_tok_s']:.0f} | {share} | "
            f"{r['weights_bytes_per_rank'] / 1e6:.1f} | {r['kv_bytes_per_token_per_rank']} | "
            f"{r['bytes_read_per_step_per_rank'] / 1e6:.1f} |"
        )
    print_table_and_save(lines, args.out, args, load_before, results=results)


if __name__ == "__main__":
    main()
