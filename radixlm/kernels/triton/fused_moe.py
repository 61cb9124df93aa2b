"""Fused Mixture-of-Experts: the routed experts of one MoE layer as two grouped GEMMs over
the (token, expert) pairs sorted by expert.

1. `moe_align`: the T * k pairs (pair p = token p // k, its (p % k)-th expert) sorted by
   expert and each expert's run padded to a multiple of BLOCK_M with a sentinel (T * k),
   so every BLOCK_M-row tile belongs to one expert; per tile its expert id, and the padded
   length. Torch ops on the device, no host synchronisation (the grid covers the worst
   case; tiles past the padded length return at once), so CUDA graphs can capture it.
2. Grouped GEMM over x: gate_up[p] = x[p // k] @ w13[e(p)].T for every pair, each tile
   reading its expert's weights once for its BLOCK_M rows.
3. silu(gate) * up (`norm.silu_and_mul`).
4. Grouped GEMM over the activations: y[p] = weight[p] * (h[p] @ w2[e(p)].T), the routing
   weight applied in fp32 to the accumulator.
5. out[t] = sum over j of y[t * k + j].

The same design as SGLang's and vLLM's fused_moe (moe_align_block_size, then grouped
GEMMs over sorted token ids); reference: `layers.moe_experts.StackedExperts`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.common import dot_precision
from radixlm.kernels.triton.norm import silu_and_mul


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the pairs of ids [T, k] (int expert ids in [0, num_experts)) by expert, each
    expert's run padded to a multiple of `block_m`.

    Returns sorted_ids int32 [L] (pair indices, padding = T * k), expert_ids int32
    [L / block_m] (the expert of each tile; tiles past the padded length hold
    num_experts) and num_padded int32 [1] (the padded length actually used), where
    L = T * k + min(E, T * k) * (block_m - 1) rounded up to block_m bounds every routing.
    """
    pairs = ids.numel()
    flat = ids.flatten().long()
    # scatter_add, not bincount: CUDA's bincount reads the maximum id back to the host.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    expert_sorted = flat[order]
    first = torch.cumsum(counts, 0) - counts  # each expert's first index in `order`
    rank = torch.arange(pairs, device=ids.device) - first[expert_sorted]
    bound = pairs + min(num_experts, pairs) * (block_m - 1)
    length = triton.cdiv(bound, block_m) * block_m
    sorted_ids = torch.full((length,), pairs, dtype=torch.int32, device=ids.device)
    sorted_ids[starts[expert_sorted] + rank] = order.to(torch.int32)
    tile_starts = torch.arange(0, length, block_m, device=ids.device)
    expert_ids = torch.searchsorted(ends, tile_starts, right=True).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


@triton.jit
def _grouped_gemm_kernel(
    A, B, C, W, SortedIds, ExpertIds, NumPadded,
    num_pairs, N, K,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    ROWS_PER_A: tl.constexpr, MUL_WEIGHT: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """C[p, n] = (weight[p] *) sum_k A[p // ROWS_PER_A, k] * B[e(p), n, k] for the pairs p
    of tile program_id(0), columns of tile program_id(1)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(NumPadded):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(SortedIds + offs_m)
    valid = pair < num_pairs
    expert = tl.load(ExpertIds + pid_m).to(tl.int64)
    row = (pair // ROWS_PER_A).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + row[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k + k0 < K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if MUL_WEIGHT:
        w = tl.load(W + pair, mask=valid, other=0.0).to(tl.float32)
        acc = acc * w[:, None]
    c_ptrs = C + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


def _grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    align: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    rows_per_a: int,
    weights: torch.Tensor | None,
    block: tuple[int, int, int],
) -> None:
    """out [P, N] = grouped a [P / rows_per_a, K] @ b[e].T (b [E, N, K]), see the kernel."""
    sorted_ids, expert_ids, num_padded = align
    block_m, block_n, block_k = block
    n, k = b.shape[1], b.shape[2]
    grid = (expert_ids.numel(), triton.cdiv(n, block_n))
    w = weights if weights is not None else out  # not read without MUL_WEIGHT
    _grouped_gemm_kernel[grid](
        a, b, out, w, sorted_ids, expert_ids, num_padded,
        out.shape[0], n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1),
        ROWS_PER_A=rows_per_a, MUL_WEIGHT=weights is not None,
        PRECISION=dot_precision(a.dtype),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 32,
) -> torch.Tensor:
    """Routed experts of one MoE layer: out[t] = sum_j weights[t, j] *
    down_{e}(silu(gate_{e}(x[t])) * up_{e}(x[t])) with e = ids[t, j].

    Args:
        x: [T, H] (fp32, fp16 or bf16, rows contiguous). w13: [E, 2I, H] in x's dtype,
            each expert's gate rows then up rows. w2: [E, H, I]. ids: [T, k] int expert
            ids in [0, E). weights: [T, k] routing weights (any float dtype).
        block_m, block_n, block_k: tile sizes, powers of two >= 16 (tl.dot's minimum).
    Returns [T, H] in x's dtype (fp32 accumulation; the routed product rounded to x's dtype
    before the sum over k).
    Grid: (L / block_m, cdiv(N, block_n)) per GEMM, L from `moe_align`.
    Reference: `radixlm.runtime.executor.layers.moe_experts.StackedExperts`.
    """
    t, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    k = ids.shape[1]
    block = (block_m, block_n, block_k)
    align = moe_align(ids, num_experts, block_m)
    gate_up = torch.empty(t * k, two_i, dtype=x.dtype, device=x.device)
    _grouped_gemm(x, w13, gate_up, align, k, None, block)
    inter = two_i // 2
    h = silu_and_mul(gate_up[:, :inter], gate_up[:, inter:])
    y = torch.empty(t * k, hidden, dtype=x.dtype, device=x.device)
    _grouped_gemm(h, w2, y, align, 1, weights.flatten().contiguous(), block)
    return y.view(t, k, hidden).sum(dim=1)
