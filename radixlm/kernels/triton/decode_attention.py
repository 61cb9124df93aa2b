"""Paged decode attention with split-K (flash-decoding) and grouped-query heads.

One query token per request attends over the request's `seq_len` keys, read slot by slot
through the request-to-token table, so any page size works (a page is a run of slots).
With a sliding window W > 0 it attends over its last W keys only: [lo, seq_len), lo =
max(0, seq_len - W) (lo = 0 without one).

Stage 1 (`_decode_split_kernel`), grid (B, num_kv_heads, num_splits): program (b, g, s)
handles the `group = H // Hkv` query heads sharing KV head g (padded to BLOCK_H >= 16 rows
so `tl.dot` maps to tensor cores) over keys [lo + s * chunk, min(lo + (s + 1) * chunk,
seq_len)), chunk = cdiv(cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N, in
BLOCK_N-key tiles with an online softmax. It writes the split's normalised output and
log-sum-exp (natural log); an empty split writes lse = -inf and output 0.
Stage 2 (`_decode_merge_kernel`), grid (B, H): softmax-weights the splits by their lse.

Reference: `TorchNativeBackend.forward_decode` (softmax(q K^T * scale) V over the gathered
keys); Dao et al. 2023, "Flash-Decoding for long-context inference".
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.common import dot_precision, interpreting, next_pow2
from radixlm.kernels.triton.store_kv import fp8_code, kernel_view
from radixlm.kernels.triton.tiles import load_kv_tile, online_softmax_step


@triton.jit
def _decode_split_kernel(
    Q,  # [B, H, Dk]
    K_Buf,  # [num_slots, Hkv, Dk]
    V_Buf,  # [num_slots, Hkv, Dv] (may be a view of K_Buf's first Dv columns)
    Req_to_token,  # int32 [rows, context]
    Req_pool_indices,  # int64 [B]
    Seq_lens,  # int64 [B]
    Mid_O,  # fp32 [B, H, S, Dv]
    Mid_Lse,  # fp32 [B, H, S]
    sm_scale,  # the softmax scale times an fp8 pool's K scale
    v_scale,  # an fp8 pool's V scale (1.0 otherwise)
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_r2t,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    window,  # sliding window (read only when SLIDING)
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
    SLIDING: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_H)
    mask_h = offs_g < GROUP
    offs_h = kvh * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < HEAD_DIM_V

    seq_len = tl.load(Seq_lens + b).to(tl.int32)
    row = tl.load(Req_pool_indices + b).to(tl.int64)
    if SLIDING:
        lo = tl.maximum(seq_len - window, 0)
    else:
        lo = 0
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    q = tl.load(
        Q + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_tile(
            K_Buf, V_Buf, Req_to_token, row, stride_r2t, kvh, stride_ks, stride_kh,
            stride_vs, stride_vh, offs_n, mask_n, offs_d, mask_d, offs_dv, mask_dv, KV_FP8,
        )  # fmt: skip
        qk = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * sm_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, v.to(q.dtype), m_i, l_i, acc, PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None] * v_scale
    lse = m_i + tl.log(l_safe)  # -inf for an empty split
    tl.store(
        Mid_O
        + b * stride_mob
        + offs_h[:, None] * stride_moh
        + split * stride_mos
        + offs_dv[None, :],
        out,
        mask=mask_h[:, None] & mask_dv[None, :],
    )
    tl.store(Mid_Lse + b * stride_mlb + offs_h * stride_mlh + split, lse, mask=mask_h)


@triton.jit
def _decode_merge_kernel(
    Mid_O,  # fp32 [B, H, S, Dv]
    Mid_Lse,  # fp32 [B, H, S]
    Out,  # [B, H, Dv]
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(
        Mid_Lse + b * stride_mlb + h * stride_mlh + offs_s, mask=mask_s, other=float("-inf")
    )
    w = tl.exp(lse - tl.max(lse, 0))  # split 0 is never empty, so the max is finite
    o = tl.load(
        Mid_O + b * stride_mob + h * stride_moh + offs_s[:, None] * stride_mos + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(
        Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=mask_d
    )


@functools.cache
def _multi_processors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_kv_splits(batch_size: int, num_kv_heads: int, device: torch.device) -> int:
    """Splits per request: enough (batch * kv_heads * splits) programs to fill the GPU twice,
    a power of two in [1, 16] (one compiled variant each); 4 under the interpreter (so the
    tests cross split boundaries)."""
    if device.type != "cuda":
        return 4
    sms = _multi_processors(device.index if device.index is not None else 0)
    want = -(-2 * sms // max(batch_size * num_kv_heads, 1))
    return min(16, next_pow2(want))


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scaling: float,
    num_splits: int,
    block_n: int | None = None,
    window: int = 0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Decode attention of one token per request over its paged K/V.

    Args:
        q: [B, H, Dk] (fp32/fp16/bf16). k_buf: [num_slots, Hkv, Dk]; v_buf: [num_slots, Hkv,
            Dv], any strides (e.g. the view k_buf[:, :, :Dv] of a latent pool); H % Hkv == 0.
        req_to_token: int32 [rows, context]; req_pool_indices, seq_lens: int64 [B], seq_len >= 1.
        scaling: softmax scale. num_splits: key splits per request (see `num_kv_splits`).
        block_n: keys per tile (default 64 on GPU, 16 under the interpreter).
        window: sliding window (each request sees its last `window` keys); 0 for none
            (a separate compiled variant, as fast as before windows existed).
        k_scale, v_scale: an fp8 pool's scales of this layer (read value = code * scale;
            the K scale is folded into the softmax scale, the V scale into the output).
    Returns:
        [B, H, Dv] in q's dtype; fp32 accumulation. Workspace: fp32 [B, H, S, Dv] + [B, H, S].
    Grid: stage 1 (B, Hkv, S), stage 2 (B, H); BLOCK_H = max(16, pow2(H / Hkv)),
        BLOCK_D = pow2(Dk), BLOCK_DV = pow2(Dv), BLOCK_S = pow2(S).
    """
    bsz, heads, dim = q.shape
    kv_heads, dim_v = k_buf.shape[1], v_buf.shape[2]
    group = heads // kv_heads
    block_n = block_n or (16 if interpreting() else 64)
    block_d = next_pow2(dim)
    mid_o, mid_lse, out = split_workspace(q, num_splits, dim_v)
    code = fp8_code(k_buf.dtype)
    k_buf, v_buf = kernel_view(k_buf), kernel_view(v_buf)
    _decode_split_kernel[(bsz, kv_heads, num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse,
        scaling * k_scale, v_scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1),
        v_buf.stride(0), v_buf.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        window,
        GROUP=group, HEAD_DIM=dim, HEAD_DIM_V=dim_v, NUM_SPLITS=num_splits,
        BLOCK_H=max(16, next_pow2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        BLOCK_DV=next_pow2(dim_v), PRECISION=dot_precision(q.dtype), SLIDING=window > 0,
        KV_FP8=code, num_warps=4, num_stages=2,
    )  # fmt: skip
    merge_splits(mid_o, mid_lse, out)
    return out


def split_workspace(
    q: torch.Tensor, num_splits: int, dim_v: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split kernels' outputs for q [B, H, Dk]: per-split outputs fp32 [B, H, S, Dv],
    their log-sum-exps fp32 [B, H, S], and the merged output [B, H, Dv] in q's dtype."""
    bsz, heads, _ = q.shape
    mid_o = torch.empty(bsz, heads, num_splits, dim_v, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(bsz, heads, num_splits, dtype=torch.float32, device=q.device)
    return mid_o, mid_lse, q.new_empty(bsz, heads, dim_v)


def merge_splits(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor) -> None:
    """out[b, h] = the splits' outputs mid_o[b, h, s] weighted by softmax_s(mid_lse[b, h, s])
    (`_decode_merge_kernel`, grid (B, H))."""
    bsz, heads, num_splits, dim_v = mid_o.shape
    _decode_merge_kernel[(bsz, heads)](
        mid_o, mid_lse, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=dim_v, NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits),
        BLOCK_D=next_pow2(dim_v),
    )  # fmt: skip
