"""CPU decode attention against the KV pool's layout: 4 KiB or transparent huge pages, and
each request's prompt slots in descending or ascending order.

A decode step's attention reads every request's K and V rows through its slot list
(`decode_attention.c`), so how those rows lie in memory sets what the TLB and the
hardware prefetchers see. This script times `CpuKernels.decode_attention` over one step's
layers of a SmolLM2-sized pool (9 query / 3 KV heads x 64, 30 layers, as large as the
engine's default 20,000-slot pool) for a batch of B requests of L keys: a prompt of P
slots in one run per request (descending, as `PagedAllocator` handed them out before, or
ascending, as it does now), then L - P generated tokens whose slots interleave across the
batch (each decode step allocates one slot per request). The pool is either
`torch.empty` buffers (4 KiB pages where transparent huge pages are `madvise`-only) or one
`empty_in_huge_pages` mapping, as `KVPool` now allocates on the CPU. Layouts alternate
within each repetition; the table gives the median and each layout's ratio to the old
one (4 KiB, descending), paired within repetitions.

    python benchmarks/kv_layout.py --threads 1 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import print_table_and_save  # noqa: E402
from shared_prefix_attention import (  # noqa: E402
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    load_kernels,
    step_seconds,
)

from radixlm.kernels.cpu import empty_in_huge_pages  # noqa: E402

#: Slots of the pool, as many as the engine's default pool on this model.
POOL_SLOTS = 20_001


def slot_tables(batch: int, length: int, prompt: int) -> dict[str, torch.Tensor]:
    """int64 [batch, length] slot lists: the prompt's slots descending or ascending (one
    run per request, from slot 1), then the generated tokens' interleaved ones."""
    gen = length - prompt
    generated = (
        batch * prompt + 1 + torch.arange(gen)[None, :] * batch + torch.arange(batch)[:, None]
    )
    asc = 1 + torch.arange(batch * prompt).reshape(batch, prompt)
    return {
        "descending": torch.cat([asc.flip(1), generated], 1),
        "ascending": torch.cat([asc, generated], 1),
    }


def pools() -> dict[str, tuple[list[torch.Tensor], list[torch.Tensor], object]]:
    """Both pool kinds: (k buffers, v buffers, mapping to keep alive), random values."""
    shape = (POOL_SLOTS, KV_HEADS, HEAD_DIM)
    plain = [torch.randn(shape) for _ in range(2 * LAYERS)]
    arena, huge = empty_in_huge_pages([(shape, torch.float32)] * (2 * LAYERS))
    if arena is None:
        raise SystemExit("this kernel gives no transparent huge pages (madvise refused)")
    for h, p in zip(huge, plain):
        h.copy_(p)
    return {
        "4k": (plain[:LAYERS], plain[LAYERS:], None),
        "huge": (huge[:LAYERS], huge[LAYERS:], arena),
    }


def run(threads: int, batch: int, length: int, prompt: int, reps: int) -> dict:
    """Best-of-3 time of one step's attention (LAYERS layers) per pool kind and slot order,
    median over `reps` alternated repetitions, and each one's paired ratio to 4k-descending."""
    kernels = load_kernels(threads)
    kinds, tables = pools(), slot_tables(batch, length, prompt)
    q = torch.randn(batch, HEADS, HEAD_DIM)
    seq_lens = torch.full((batch,), length, dtype=torch.int64)

    def step(kind: str, table: torch.Tensor) -> float:
        k_bufs, v_bufs, _ = kinds[kind]
        return step_seconds(kernels, q, k_bufs, v_bufs, table, seq_lens)

    layouts = [(kind, order) for kind in kinds for order in tables]
    times: dict[tuple[str, str], list[float]] = {lay: [] for lay in layouts}
    for r in range(reps):
        for kind, order in layouts if r % 2 == 0 else reversed(layouts):
            times[(kind, order)].append(step(kind, tables[order]))
    base = times[("4k", "descending")]
    rows = []
    for (kind, order), ts in times.items():
        ratios = [b / t for b, t in zip(base, ts)]
        rows.append({"threads": threads, "pages": kind, "prompt_slots": order,
                     "ms": statistics.median(ts) * 1e3, "speedup": statistics.median(ratios),
                     "speedup_min": min(ratios), "speedup_max": max(ratios)})  # fmt: skip
    return {"threads": threads, "batch": batch, "len": length, "prompt": prompt, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="(default 1 2)")
    ap.add_argument("--batch", type=int, default=16, help="requests (default 16)")
    ap.add_argument("--len", type=int, default=300, help="keys per request (default 300)")
    ap.add_argument("--prompt", type=int, default=256, help="prompt slots (default 256)")
    ap.add_argument("--reps", type=int, default=7, help="alternated repetitions (default 7)")
    ap.add_argument("--output", default="benchmarks/results/kv_layout.json")
    args = ap.parse_args(argv)
    if not 0 < args.prompt <= args.len or args.batch < 1 or args.batch * args.len >= POOL_SLOTS:
        ap.error(f"need 0 < --prompt <= --len, --batch >= 1, batch x len < {POOL_SLOTS}")
    load_before = os.getloadavg()
    runs = [run(t, args.batch, args.len, args.prompt, args.reps) for t in args.threads]
    lines = [
        f"{LAYERS} layers x {HEADS} / {KV_HEADS} heads x {HEAD_DIM}, fp32 KV, "
        f"{POOL_SLOTS}-slot pool, batch {args.batch} x {args.len} keys ({args.prompt} prompt, "
        f"{args.len - args.prompt} generated), {args.reps} alternated repetitions",
        "",
        "| threads | pages | prompt slots | attention ms | speedup vs 4k descending (min-max) |",
        "|---|---|---|---|---|",
    ]
    for run_ in runs:
        for r in run_["rows"]:
            lines.append(
                f"| {r['threads']} | {r['pages']} | {r['prompt_slots']} | {r['ms']:.2f} | "
                f"{r['speedup']:.3f}x ({r['speedup_min']:.3f}-{r['speedup_max']:.3f}) |"
            )
    print_table_and_save(lines, Path(args.output), args, load_before, runs=runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
