"""Store the new tokens' K and V into the paged KV pool."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.common import next_pow2


@triton.jit
def _store_kv_kernel(
    K,  # [T, Hkv * D] rows
    V,
    K_Buf,  # [num_slots, Hkv * D] rows
    V_Buf,
    Loc,  # int64 [T]
    stride_k,
    stride_v,
    stride_kb,
    stride_vb,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(Loc + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    k = tl.load(K + t * stride_k + offs, mask=mask)
    v = tl.load(V + t * stride_v + offs, mask=mask)
    tl.store(K_Buf + slot * stride_kb + offs, k.to(K_Buf.dtype.element_ty), mask=mask)
    tl.store(V_Buf + slot * stride_vb + offs, v.to(V_Buf.dtype.element_ty), mask=mask)


def store_kv(
    k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """k_buf[loc[t]] = k[t], v_buf[loc[t]] = v[t], cast to the pool dtype.

    Args:
        k_buf, v_buf: [num_slots, Hkv, D], contiguous rows. loc: int64 [T] distinct slots.
        k, v: [T, Hkv, D] (any float dtype; each token's Hkv * D values contiguous).
    Grid: (T,); BLOCK = pow2(Hkv * D). Reference: `KVPool.set_kv` (index_copy_).
    """
    tokens = loc.numel()
    if tokens == 0:
        return
    row = k_buf.shape[1] * k_buf.shape[2]
    k, v = k.reshape(tokens, row), v.reshape(tokens, row)
    _store_kv_kernel[(tokens,)](
        k, v, k_buf, v_buf, loc, k.stride(0), v.stride(0), k_buf.stride(0), v_buf.stride(0),
        ROW=row, BLOCK=next_pow2(row),
    )  # fmt: skip
