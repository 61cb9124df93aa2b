"""Launch settings shared by the Triton kernels."""

from __future__ import annotations

import torch
import triton

from radixlm.kernels import triton_interpreting as interpreting

__all__ = ["dot_precision", "interpreting", "next_pow2"]


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (tl.arange sizes must be powers of two)."""
    return triton.next_power_of_2(max(int(n), 1))


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: exact fp32 products for fp32 (the 1e-4 contract), else tf32
    (ignored for fp16/bf16 inputs, which multiply on tensor cores at full precision)."""
    return "ieee" if dtype == torch.float32 else "tf32"
