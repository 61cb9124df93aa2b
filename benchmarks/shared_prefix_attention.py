"""CPU decode attention when the batch's requests share a cached prefix, against the same
batch over distinct KV slots and against the bytes it must read.

With a radix cache, B requests that share a P-token prefix point at the same P slots of
the KV pool, and `decode_attention.c` reads those shared keys once for the whole group
(cascade attention: Hydragen, Juravsky et al. 2024; FlashInfer's cascade inference),
then each request's own keys. This script times `CpuKernels.decode_attention` over the
layers of a SmolLM2-sized pool (9 query / 3 KV heads x 64) for a batch of B requests of
L tokens, their slot lists either distinct or sharing the first P slots, and prints each
time next to its memory bound: the K and V bytes a step reads when every row is fetched
once (distinct: B L rows; shared: P + B (L - P) rows) over the bandwidth measured here
(`machine.py`). Layouts alternate within each repetition.

    python benchmarks/shared_prefix_attention.py --threads 1 2 --batch 16 --len 300 --prefix 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import memory_bandwidth  # noqa: E402
from report import print_table_and_save  # noqa: E402

from radixlm.kernels.cpu import CpuKernels  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 30


def slot_tables(batch: int, length: int, prefix: int) -> dict[str, torch.Tensor]:
    """int64 [batch, length] slot lists: every row its own slots, or the first `prefix`
    slots shared by all rows and the rest their own."""
    distinct = torch.arange(batch * length).reshape(batch, length)
    shared = torch.empty(batch, length, dtype=torch.int64)
    shared[:, :prefix] = torch.arange(prefix)
    shared[:, prefix:] = prefix + torch.arange(batch * (length - prefix)).reshape(batch, -1)
    return {"distinct": distinct, "shared": shared}


def load_kernels(threads: int) -> CpuKernels:
    """radixlm's CPU kernels on `threads` torch threads; exits where they cannot build."""
    torch.set_num_threads(threads)
    kernels = CpuKernels.load()
    if kernels is None:
        raise SystemExit("radixlm's CPU kernels are not available here")
    return kernels


def step_seconds(kernels: CpuKernels, q, k_bufs, v_bufs, table, seq_lens) -> float:
    """Best of 3 times (s) of one decode step's attention: q float32 [B, HEADS, HEAD_DIM]
    over every layer's (k, v) buffer pair through the slot `table` int64 [B, >= L]."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for k, v in zip(k_bufs, v_bufs):
            kernels.decode_attention(q, k, v, table, seq_lens, 0.125)
        best = min(best, time.perf_counter() - t0)
    return best


def run(threads: int, batch: int, length: int, prefix: int, reps: int) -> dict:
    """Best-of-3 time of one step's attention (LAYERS layers), median over `reps`
    alternated repetitions, per layout; and the memory-bound time of each."""
    kernels = load_kernels(threads)
    slots = batch * length
    k_bufs = [torch.randn(slots, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
    v_bufs = [torch.randn(slots, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
    q = torch.randn(batch, HEADS, HEAD_DIM)
    seq_lens = torch.full((batch,), length, dtype=torch.int64)
    tables = slot_tables(batch, length, prefix)
    times: dict[str, list[float]] = {name: [] for name in tables}
    for r in range(reps):
        order = list(tables) if r % 2 == 0 else list(reversed(tables))
        for name in order:
            times[name].append(step_seconds(kernels, q, k_bufs, v_bufs, tables[name], seq_lens))
    bandwidth = memory_bandwidth(threads)
    row_bytes = 2 * KV_HEADS * HEAD_DIM * 4 * LAYERS  # K and V of one token, every layer
    rows_read = {"distinct": batch * length, "shared": prefix + batch * (length - prefix)}
    out = {"threads": threads, "batch": batch, "len": length, "prefix": prefix,
           "bandwidth_gbs": bandwidth / 1e9}  # fmt: skip
    for name in tables:
        out[f"{name}_ms"] = statistics.median(times[name]) * 1e3
        out[f"{name}_bound_ms"] = rows_read[name] * row_bytes / bandwidth * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="(default 1 2)")
    ap.add_argument("--batch", type=int, default=16, help="requests (default 16)")
    ap.add_argument("--len", type=int, default=300, help="tokens per request (default 300)")
    ap.add_argument("--prefix", type=int, default=200, help="shared tokens (default 200)")
    ap.add_argument("--reps", type=int, default=5, help="alternated repetitions (default 5)")
    ap.add_argument("--output", default="benchmarks/results/shared_prefix_attention.json")
    args = ap.parse_args(argv)
    if not 0 <= args.prefix < args.len or args.batch < 1:
        ap.error("need --batch >= 1 and 0 <= --prefix < --len")
    load_before = os.getloadavg()
    rows = [run(t, args.batch, args.len, args.prefix, args.reps) for t in args.threads]
    lines = [
        f"{LAYERS} layers x {HEADS} / {KV_HEADS} heads x {HEAD_DIM}, fp32 KV, batch "
        f"{args.batch} x {args.len} tokens, {args.prefix} of them shared in the shared rows",
        "",
        "| threads | layout | attention ms | memory-bound ms | ratio to the bound |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        for name in ("distinct", "shared"):
            ms, bound = r[f"{name}_ms"], r[f"{name}_bound_ms"]
            lines.append(
                f"| {r['threads']} | {name} | {ms:.2f} | {bound:.2f} | {ms / bound:.2f}x |"
            )
    print_table_and_save(lines, Path(args.output), args, load_before, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
