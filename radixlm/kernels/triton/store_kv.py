"""Store the new tokens' K and V into the paged KV pool (fp8 pools quantized on the way,
`radixlm.kernels.fp8`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.fp8 import FP8_MAX, is_fp8
from radixlm.kernels.triton.common import next_pow2
from radixlm.kernels.triton.tiles import f32_to_fp8

#: fp8 storage dtype -> the kernels' KV_FP8 code (0: not fp8).
FP8_CODES = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}


def fp8_code(dtype: torch.dtype) -> int:
    """The kernels' KV_FP8 code of a pool dtype: 1 e4m3fn, 2 e5m2, 0 otherwise."""
    return FP8_CODES.get(dtype, 0)


def kernel_view(buf: torch.Tensor) -> torch.Tensor:
    """A KV buffer as the kernels take it: fp8 as its uint8 codes, else as is."""
    return buf.view(torch.uint8) if is_fp8(buf.dtype) else buf


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
    k_scale,  # fp8 only: stored = x / scale, clamped to +-fp8_max
    v_scale,
    fp8_max,
    ROW_K: tl.constexpr,
    ROW_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    STORE_V: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(Loc + t).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < ROW_K
    k = tl.load(K + t * stride_k + offs, mask=mask)
    if KV_FP8 > 0:
        k = f32_to_fp8(tl.clamp(k.to(tl.float32) / k_scale, -fp8_max, fp8_max), KV_FP8)
    tl.store(K_Buf + slot * stride_kb + offs, k.to(K_Buf.dtype.element_ty), mask=mask)
    if STORE_V:
        offs_v = tl.arange(0, BLOCK_V)
        mask_v = offs_v < ROW_V
        v = tl.load(V + t * stride_v + offs_v, mask=mask_v)
        if KV_FP8 > 0:
            v = f32_to_fp8(tl.clamp(v.to(tl.float32) / v_scale, -fp8_max, fp8_max), KV_FP8)
        tl.store(V_Buf + slot * stride_vb + offs_v, v.to(V_Buf.dtype.element_ty), mask=mask_v)


def store_kv(
    k_buf: torch.Tensor,
    v_buf: torch.Tensor | None,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """k_buf[loc[t]] = k[t], v_buf[loc[t]] = v[t], cast to the pool dtype; v_buf None
    stores K alone (a latent pool, whose V buffer is a view of K's first Dv columns).
    An fp8 pool stores fp8(clamp(float32(x) / scale, +-max)) with `k_scale` / `v_scale`
    (`kernels.fp8.quantize`; the same bytes).

    Args:
        k_buf: [num_slots, Hkv, Dk], v_buf: [num_slots, Hkv, Dv], each slot's row
            contiguous. loc: int64 [T] distinct slots.
        k: [T, Hkv, Dk], v: [T, Hkv, Dv] (any float dtype; each token's values contiguous).
    Grid: (T,); BLOCK_K = pow2(Hkv * Dk), BLOCK_V = pow2(Hkv * Dv). Reference:
    `KVPool.set_kv`.
    """
    tokens = loc.numel()
    if tokens == 0:
        return
    code = fp8_code(k_buf.dtype)
    fp8_max = FP8_MAX.get(k_buf.dtype, 0.0)
    k_buf = kernel_view(k_buf)
    v_buf = None if v_buf is None else kernel_view(v_buf)
    row_k = k_buf.shape[1] * k_buf.shape[2]
    k = k.reshape(tokens, row_k)
    row_v = 0 if v_buf is None else v_buf.shape[1] * v_buf.shape[2]
    if v_buf is None:
        v, v_buf = k, k_buf  # placeholders, never read
    else:
        v = v.reshape(tokens, row_v)
    _store_kv_kernel[(tokens,)](
        k, v, k_buf, v_buf, loc, k.stride(0), v.stride(0), k_buf.stride(0), v_buf.stride(0),
        k_scale, v_scale, fp8_max,
        ROW_K=row_k, ROW_V=row_v, BLOCK_K=next_pow2(row_k), BLOCK_V=next_pow2(row_v),
        STORE_V=row_v > 0, KV_FP8=code,
    )  # fmt: skip
