"""Accelerator specs for the planner: a table of published numbers, plus the local CPU
measured on the spot.

GPU figures are the vendors' datasheet numbers for dense math (without 2:4 structured
sparsity, which datasheets quote as the larger "with sparsity" figure, twice these):
  * H100 SXM: NVIDIA H100 Tensor Core GPU datasheet — 80 GB HBM3, 3.35 TB/s, BF16 989.5
    TFLOPS, FP8 / INT8 1,979, TF32 494.5, NVLink 900 GB/s.
  * H200 (SXM): NVIDIA H200 datasheet — 141 GB HBM3e, 4.8 TB/s, same tensor cores as
    H100 SXM (BF16 989.5, FP8 / INT8 1,979 TFLOPS), NVLink 900 GB/s.
  * A100 80GB SXM: NVIDIA A100 datasheet — 80 GB HBM2e, 2,039 GB/s, BF16 312, INT8 624,
    TF32 156 TFLOPS, no FP8, NVLink 600 GB/s.
  * L40S: NVIDIA L40S datasheet — 48 GB GDDR6, 864 GB/s, BF16 362.05, FP8 / INT8 733,
    TF32 183 TFLOPS, no NVLink (PCIe Gen4 x16, 32 GB/s per direction).
  * B200: NVIDIA HGX B200 datasheet, per GPU (8-GPU totals divided by 8) — 180 GB
    HBM3e, about 8 TB/s, BF16 2.25, FP8 / INT8 4.5, TF32 1.1 PFLOPS, NVLink 5 1.8 TB/s.
Memory capacities are the datasheet GB taken as 10^9 bytes. The driver usually reports a
little more (an "80 GB" H100 shows about 79.6 GiB = 85.5e9 bytes), so capacities here are
slightly conservative. Datasheet peaks are upper bounds: real kernels reach roughly
60-80% of peak FLOP/s and 80-90% of peak bandwidth, which `derate` models.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field, replace

from radixlm.plan.dtypes import compute_precision
from radixlm.plan.validate import FRACTION

GB = 1e9
TERA = 1e12


@dataclass(frozen=True)
class Hardware:
    """One accelerator. Units: bytes, bytes/s, FLOP/s (per precision)."""

    name: str
    memory_bytes: float
    mem_bandwidth: float
    peak_flops: dict[str, float] = field(default_factory=dict)
    interconnect_bandwidth: float = 0.0
    source: str = ""
    measured: bool = False
    copy_bandwidth: float = 0.0  # measured CPUs only: read + write bytes/s of a copy

    def flops(self, precision: str) -> float:
        """Peak dense FLOP/s for `precision` (bf16 when the chip lacks that precision)."""
        return self.peak_flops.get(precision) or self.peak_flops["bf16"]

    def flops_for_weights(self, weight_dtype: str) -> float:
        return self.flops(compute_precision(weight_dtype))

    def ridge_point(self, weight_dtype: str = "bf16") -> float:
        """Williams et al. 2009 roofline ridge: peak FLOP/s / bandwidth, in FLOP/byte."""
        return self.flops_for_weights(weight_dtype) / self.mem_bandwidth


def _gpu(
    name: str,
    mem_gb: float,
    bw_tbs: float,
    bf16: float,
    fp8: float,
    int8: float,
    fp32: float,
    link_gbs: float,
    source: str,
) -> Hardware:
    peaks = {"bf16": bf16 * TERA, "int8": int8 * TERA, "fp32": fp32 * TERA}
    if fp8:
        peaks["fp8"] = fp8 * TERA
    return Hardware(name, mem_gb * GB, bw_tbs * TERA, peaks, link_gbs * GB, source)


GPUS: dict[str, Hardware] = {
    "H100-SXM": _gpu(
        "H100-SXM", 80, 3.35, 989.5, 1979, 1979, 494.5, 900, "NVIDIA H100 datasheet (SXM5, dense)"
    ),
    "H200": _gpu(
        "H200", 141, 4.8, 989.5, 1979, 1979, 494.5, 900, "NVIDIA H200 datasheet (SXM, dense)"
    ),
    "A100-80GB": _gpu(
        "A100-80GB", 80, 2.039, 312, 0, 624, 156, 600, "NVIDIA A100 datasheet (80GB SXM, dense)"
    ),
    "L40S": _gpu("L40S", 48, 0.864, 362.05, 733, 733, 183, 32, "NVIDIA L40S datasheet (dense)"),
    "B200": _gpu(
        "B200", 180, 8.0, 2250, 4500, 4500, 1100, 1800, "NVIDIA HGX B200 datasheet, per GPU (dense)"
    ),
}


def gpu_names() -> list[str]:
    return [*GPUS, "cpu"]


def _normalize(name: str) -> str:
    return name.lower().replace(" ", "").replace("-", "").replace("_", "")


def derate(hw: Hardware, flops_eff: float = 1.0, bw_eff: float = 1.0) -> Hardware:
    """Scale peaks by achievable fractions (model FLOP and bandwidth utilization), each
    in (0, 1]."""
    FRACTION.check("flops_eff", flops_eff)
    FRACTION.check("bw_eff", bw_eff)
    if flops_eff == 1.0 and bw_eff == 1.0:
        return hw
    peaks = {k: v * flops_eff for k, v in hw.peak_flops.items()}
    return replace(hw, peak_flops=peaks, mem_bandwidth=hw.mem_bandwidth * bw_eff)


def get_hardware(name: str) -> Hardware:
    """Look up a GPU by name (case, spaces and dashes ignored: "H100 SXM", "h100-sxm",
    "a100" all work) or measure the local CPU for ``cpu``.

    Raises:
        ValueError: unknown name.
    """
    key = _normalize(name)
    if key == "cpu":
        return measure_cpu()
    exact = [hw for n, hw in GPUS.items() if _normalize(n) == key]
    prefixed = [hw for n, hw in GPUS.items() if _normalize(n).startswith(key)]
    if exact or len(prefixed) == 1:
        return (exact or prefixed)[0]
    raise ValueError(f"unknown gpu {name!r}; choose from {', '.join(gpu_names())}")


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 0.0


def _best_rate(work: float, fn, budget_s: float) -> float:
    """Run `fn` repeatedly for about `budget_s` seconds; return work / best time."""
    fn()  # warm-up (allocations, first-touch page faults)
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    while True:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            return work / best


@functools.cache
def measure_cpu(budget_s: float = 0.3) -> Hardware:
    """Measure this machine's single-thread fp32 matmul FLOP/s and memory bandwidth.

    Three timings, each the best run within `budget_s` (about 1-2 s in all, cached for
    the process), on one thread, matching how radixlm's tests and CI run the engine:
      * matmul: 512 x 512 fp32 square product, 2 * 512^3 FLOPs -> `peak_flops` (used
        for every precision: CPU matmuls in radixlm run in fp32);
      * copy: a 64 MiB fp32 tensor into another, counting read plus write ->
        `copy_bandwidth` (reported);
      * weight streaming: one vector multiplied by 32 separate 1024 x 1024 fp32 matrices
        (4 MiB each, 128 MiB in all, more than the caches hold), counting the matrix
        bytes -> `mem_bandwidth`, the memory roof the planner uses. This is how batch-1
        decode reads a model's weights (one `linear` per projection), and a core
        streams matrices through GEMV somewhat below its copy rate.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n = 512
        a, b = torch.randn(n, n), torch.randn(n, n)
        out = torch.empty(n, n)
        flops = _best_rate(2.0 * n**3, lambda: torch.mm(a, b, out=out), budget_s)
        numel = 16 * 1024 * 1024
        src, dst = torch.ones(numel), torch.empty(numel)
        copy = _best_rate(2.0 * 4 * numel, lambda: dst.copy_(src), budget_s)
        mats = [torch.randn(1024, 1024) for _ in range(32)]
        x = torch.randn(1, 1024)

        def stream() -> None:
            for w in mats:
                torch.nn.functional.linear(x, w)

        streaming = _best_rate(4.0 * 1024 * 1024 * len(mats), stream, budget_s)
    finally:
        torch.set_num_threads(threads)
    peaks = {p: flops for p in ("fp32", "bf16", "fp8", "int8")}
    return Hardware(
        "cpu",
        _physical_memory(),
        streaming,
        peaks,
        0.0,
        "measured here: 1 thread, fp32 512^3 matmul, GEMV over 128 MiB of matrices",
        measured=True,
        copy_bandwidth=copy,
    )
