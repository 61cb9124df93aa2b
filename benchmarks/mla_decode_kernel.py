"""The CPU MLA decode kernel's achieved bandwidth against the machine's copy bandwidth.

`decode_attention_mla.c` (through `CpuKernels.decode_attention` on a latent pool: one KV
head whose K row is [latent (R) ; rope key (Dr)], V the view of the latent) should read
the latent cache once per step, Dk = R + Dr elements per key, whatever the head count.
This script times one layer's decode attention of B requests of L keys each (slots
scattered in pages of 16), for DeepSeek-V3's R = 512, Dr = 64 and H = 16 query heads by
default, and reports the bytes of latent read per second (B L Dk x element size / time)
next to the copy bandwidth measured in the same run (a torch copy of a 256 MiB buffer,
read + write bytes / time, best of 5), and the FLOP rate (2 H (Dk + Dv) per key: the
score and the value sum). Shapes alternate within each repetition.

    python benchmarks/mla_decode_kernel.py --threads 2 --batches 1 4 16 --contexts 1024 8192
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import print_table_and_save  # noqa: E402

from radixlm.kernels.cpu import CpuKernels  # noqa: E402

PAGE = 16
DTYPES = {"float32": torch.float32, "float16": torch.float16}


def copy_bandwidth(threads: int, mib: int = 256, tries: int = 5) -> float:
    """Bytes/s of `dst.copy_(src)` on `threads` threads, counting read + write bytes."""
    torch.set_num_threads(threads)
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def latent_batch(batch: int, ctx: int, dim: int, dtype: torch.dtype, gen: torch.Generator):
    """A latent buffer [B ctx, 1, dim] and an int64 [B, ctx] slot table of scattered pages."""
    pages = torch.randperm(batch * ctx // PAGE, generator=gen)
    slots = (pages[:, None] * PAGE + torch.arange(PAGE)).reshape(batch, ctx)
    k_buf = torch.randn(batch * ctx, 1, dim, generator=gen).to(dtype)
    return k_buf, slots.contiguous()


def step_seconds(kernels: CpuKernels, q, k_buf, v_buf, slots, seq_lens, scale) -> float:
    """Best of 3 times (s) of one layer's decode attention."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        kernels.decode_attention(q, k_buf, v_buf, slots, seq_lens, scale)
        best = min(best, time.perf_counter() - t0)
    return best


def run(args, threads: int, dtype_name: str) -> list[dict]:
    """One row per (batch, context): median over `reps` alternated repetitions."""
    torch.set_num_threads(threads)
    kernels = CpuKernels.load()
    if kernels is None:
        raise SystemExit("radixlm's CPU kernels are not available here")
    dtype, dim = DTYPES[dtype_name], args.rank + args.rope
    gen = torch.Generator().manual_seed(0)
    shapes = [(b, c) for b in args.batches for c in args.contexts]
    cases = {}
    for b, c in shapes:
        k_buf, slots = latent_batch(b, c, dim, dtype, gen)
        q = torch.randn(b, args.heads, dim, generator=gen)
        cases[b, c] = (q, k_buf, k_buf[:, :, : args.rank], slots, torch.full((b,), c))
    times: dict[tuple[int, int], list[float]] = {s: [] for s in shapes}
    for r in range(args.reps):
        for s in shapes if r % 2 == 0 else reversed(shapes):
            times[s].append(step_seconds(kernels, *cases[s], dim**-0.5))
    elem = torch.empty((), dtype=dtype).element_size()
    rows = []
    for b, c in shapes:
        sec = statistics.median(times[b, c])
        rows.append({
            "threads": threads, "kv_dtype": dtype_name, "batch": b, "context": c,
            "ms": sec * 1e3, "latent_gbs": b * c * dim * elem / sec / 1e9,
            "gflops": 2 * args.heads * (dim + args.rank) * b * c / sec / 1e9,
        })  # fmt: skip
    return rows


def cpu_model() -> str:
    """`lscpu`'s model name (else the platform's processor string)."""
    try:
        for line in os.popen("lscpu").read().splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2], help="(default 2)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--heads", type=int, default=16, help="query heads (default 16)")
    ap.add_argument("--rank", type=int, default=512, help="kv_lora_rank R (default 512)")
    ap.add_argument("--rope", type=int, default=64, help="qk_rope_head_dim Dr (default 64)")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--reps", type=int, default=3, help="alternated repetitions (default 3)")
    ap.add_argument("--output", default="benchmarks/results/mla_decode_kernel.json")
    args = ap.parse_args(argv)
    if any(c % PAGE for c in args.contexts):
        ap.error(f"contexts must be multiples of {PAGE}")
    load_before = os.getloadavg()
    rows, copy_gbs = [], {}
    for t in args.threads:
        copy_gbs[t] = copy_bandwidth(t) / 1e9
        for d in args.dtypes:
            rows += run(args, t, d)
    lines = [
        f"CPU: {cpu_model()}; one layer, H = {args.heads}, R = {args.rank}, Dr = {args.rope}; "
        "copy bandwidth (read + write): "
        + ", ".join(f"{g:.1f} GB/s on {t} threads" for t, g in copy_gbs.items()),
        "",
        "| threads | KV dtype | batch | context | ms | latent GB/s | of copy bw | GFLOP/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['kv_dtype']} | {r['batch']} | {r['context']} | "
            f"{r['ms']:.2f} | {r['latent_gbs']:.1f} | "
            f"{r['latent_gbs'] / copy_gbs[r['threads']]:.0%} | {r['gflops']:.0f} |"
        )
    print_table_and_save(
        lines, Path(args.output), args, load_before, cpu=cpu_model(), copy_gbs=copy_gbs, rows=rows
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
