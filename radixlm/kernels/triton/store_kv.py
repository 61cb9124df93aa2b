"""Store the new tokens' K and V into the paged KV pool."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.common import next_pow2


@triton.jit
def _store_kv_kernel(
    K,  # [T, Hkv * Dk] rows
    V,  # [T, Hkv * Dv] rows (read only when STORE_V)
    K_Buf,  # [num_slots, Hkv * Dk] rows
    V_Buf,
    Loc,  # int64 [T]
    stride_k,
    stride_v,
    stride_kb,
    stride_vb,
    ROW_K: tl.constexpr,
    ROW_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    STORE_V: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(Loc + t).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < ROW_K
    k = tl.load(K + t * stride_k + offs, mask=mask)
    tl.store(K_Buf + slot * stride_kb + offs, k.to(K_Buf.dtype.element_ty), mask=mask)
    if STORE_V:
        offs_v = tl.arange(0, BLOCK_V)
        mask_v = offs_v < ROW_V
        v = tl.load(V + t * stride_v + offs_v, mask=mask_v)
        tl.store(V_Buf + slot * stride_vb + offs_v, v.to(V_Buf.dtype.element_ty), mask=mask_v)


def store_kv(
    k_buf: torch.Tensor,
    v_buf: torch.Tensor | None,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
) -> None:
    """k_buf[loc[t]] = k[t], v_buf[loc[t]] = v[t], cast to the pool dtype; v_buf None
    stores K alone (a latent pool, whose V buffer is a view of K's first Dv columns).

    Args:
        k_buf: [num_slots, Hkv, Dk], v_buf: [num_slots, Hkv, Dv], each slot's row
            contiguous. loc: int64 [T] distinct slots.
        k: [T, Hkv, Dk], v: [T, Hkv, Dv] (any float dtype; each token's values contiguous).
    Grid: (T,); BLOCK_K = pow2(Hkv * Dk), BLOCK_V = pow2(Hkv * Dv). Reference:
    `KVPool.set_kv` (index_copy_).
    """
    tokens = loc.numel()
    if tokens == 0:
        return
    row_k = k_buf.shape[1] * k_buf.shape[2]
    k = k.reshape(tokens, row_k)
    row_v = 0 if v_buf is None else v_buf.shape[1] * v_buf.shape[2]
    if v_buf is None:
        v, v_buf = k, k_buf  # placeholders, never read
    else:
        v = v.reshape(tokens, row_v)
    _store_kv_kernel[(tokens,)](
        k, v, k_buf, v_buf, loc, k.stride(0), v.stride(0), k_buf.stride(0), v_buf.stride(0),
        ROW_K=row_k, ROW_V=row_v, BLOCK_K=next_pow2(row_k), BLOCK_V=next_pow2(row_v),
        STORE_V=row_v > 0,
    )  # fmt: skip
