"""Row-wise RMSNorm and fused SwiGLU activation (one program per row / row tile)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.common import next_pow2


@triton.jit
def _rms_norm_kernel(X, W, Y, stride_x, stride_y, eps, N: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + r * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    w = tl.load(W + offs, mask=mask, other=0.0)
    y = (x * rstd).to(X.dtype.element_ty).to(tl.float32) * w.to(tl.float32)
    tl.store(Y + r * stride_y + offs, y.to(Y.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = weight * (x / sqrt(mean(x^2) + eps)), the statistic in fp32.

    Args:
        x: [..., N] (last dim contiguous); weight: [N]. Returns [..., N] in the dtype of
        `weight * x` (x's dtype when both match).
    Grid: (rows,); BLOCK = pow2(N) (one row per program; N up to ~64k).
    Reference: `radixlm.runtime.executor.layers.blocks.RMSNorm` (the Hugging Face formula).
    """
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty(x2.shape, dtype=torch.result_type(x, weight), device=x.device)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, weight, y, x2.stride(0), y.stride(0), eps, N=n, BLOCK=next_pow2(n)
    )
    return y.view(x.shape)


@triton.jit
def _silu_mul_kernel(G, U, Y, stride_g, stride_u, stride_y, N, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(G + r * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + r * stride_u + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(Y + r * stride_y + offs, y.to(Y.dtype.element_ty), mask=mask)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """y = silu(gate) * up (the SwiGLU activation), computed in fp32, stored in gate's dtype.

    Args:
        gate, up: [..., N] with the same shape (last dim contiguous). Returns [..., N].
    Grid: (rows, cdiv(N, block)); block a power of two.
    Reference: `F.silu(gate) * up` as in `radixlm.runtime.executor.layers.blocks.MLP`.
    """
    n = gate.shape[-1]
    g2, u2 = gate.reshape(-1, n), up.reshape(-1, n)
    y = torch.empty_like(g2)
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(n, block))](
        g2, u2, y, g2.stride(0), u2.stride(0), y.stride(0), n, BLOCK=block
    )
    return y.view(gate.shape)
