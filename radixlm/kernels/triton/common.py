"""Launch settings shared by the Triton kernels."""

from __future__ import annotations

import os

import torch
import triton


def interpreting() -> bool:
    """True when Triton runs kernels on CPU tensors (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (tl.arange sizes must be powers of two)."""
    return triton.next_power_of_2(max(int(n), 1))


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: exact fp32 products for fp32 (the 1e-4 contract), else tf32
    (ignored for fp16/bf16 inputs, which multiply on tensor cores at full precision)."""
    return "ieee" if dtype == torch.float32 else "tf32"
