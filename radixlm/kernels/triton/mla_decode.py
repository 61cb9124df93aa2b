"""Paged decode attention of multi-head latent attention in absorbed form (DeepSeek-V2,
arXiv 2405.04434): H query heads over ONE KV head whose K row is [latent (R) ; rope key
(Dr)] and whose V row is the latent itself, so each latent row is read once for a block of
query heads and serves as both key and value.

With the key up-projection folded into the query (q_lat = q_nope W_UK, R wide) and the
value up-projection into the output, score(h, t) = q_lat[h] . c_t + q_rope[h] . k_rope_t
and out[h] = sum_t softmax_t(score) c_t: multi-query attention with Dk = R + Dr, Dv = R.

Stage 1 (`_mla_decode_split_kernel`), grid (B, cdiv(H, BLOCK_H), num_splits): program
(b, j, s) takes query heads [j BLOCK_H, (j + 1) BLOCK_H) of request b over the keys of
split s (the split rule of `decode_attention`: [lo + s chunk, min(lo + (s + 1) chunk,
seq_len)), lo = max(0, seq_len - W) with a sliding window W, else 0), in BLOCK_N-key tiles:
each tile loads its latent rows [BLOCK_N, R] and rope keys [Dr, BLOCK_N] once, scores
q_lat c^T + q_rope k_rope^T, and folds the same latent rows into the output with an online
softmax. Stage 2 is `decode_attention.merge_splits`. Memory traffic per step: the latent
rows once per (request, head block), Dk elements per key.

Reference: `TorchNativeBackend.forward_decode` over the latent pool (V = K[:, :, :R]);
SGLang's Triton MLA decode (grouped stage-1 kernel) for the head-block layout.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.common import dot_precision, interpreting, next_pow2
from radixlm.kernels.triton.decode_attention import merge_splits, split_workspace
from radixlm.kernels.triton.store_kv import fp8_code, kernel_view
from radixlm.kernels.triton.tiles import fp8_to_f32, online_softmax_step

#: Query heads per stage-1 program (`tl.dot`'s smallest M).
MLA_BLOCK_H = 16


@triton.jit
def _mla_decode_split_kernel(
    Q,  # [B, H, R + Dr]
    K_Buf,  # [num_slots, 1, R + Dr]: latent, then rope key
    Req_to_token,  # int32 [rows, context]
    Req_pool_indices,  # int64 [B]
    Seq_lens,  # int64 [B]
    Mid_O,  # fp32 [B, H, S, R]
    Mid_Lse,  # fp32 [B, H, S]
    sm_scale,  # the softmax scale times an fp8 pool's scale
    v_scale,  # an fp8 pool's scale (1.0 otherwise)
    stride_qb,
    stride_qh,
    stride_ks,
    stride_r2t,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    window,  # sliding window (read only when SLIDING)
    HEADS: tl.constexpr,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_PE: tl.constexpr,
    PRECISION: tl.constexpr,
    SLIDING: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    b = tl.program_id(0)
    hblk = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = hblk * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < HEADS
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < RANK
    offs_p = RANK + tl.arange(0, BLOCK_PE)
    mask_p = offs_p < RANK + ROPE

    seq_len = tl.load(Seq_lens + b).to(tl.int32)
    row = tl.load(Req_pool_indices + b).to(tl.int64)
    if SLIDING:
        lo = tl.maximum(seq_len - window, 0)
    else:
        lo = 0
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    q_rows = Q + b * stride_qb + offs_h[:, None] * stride_qh
    q_lat = tl.load(q_rows + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)
    q_pe = tl.load(q_rows + offs_p[None, :], mask=mask_h[:, None] & mask_p[None, :], other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        slots = tl.load(Req_to_token + row * stride_r2t + offs_n, mask=mask_n, other=0)
        slots = slots.to(tl.int64)
        lat = tl.load(
            K_Buf + slots[:, None] * stride_ks + offs_r[None, :],
            mask=mask_n[:, None] & mask_r[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_R]: the keys' latent part and the values
        pe = tl.load(
            K_Buf + slots[None, :] * stride_ks + offs_p[:, None],
            mask=mask_n[None, :] & mask_p[:, None],
            other=0.0,
        )  # [BLOCK_PE, BLOCK_N]
        if KV_FP8 > 0:
            lat = fp8_to_f32(lat, KV_FP8)
            pe = fp8_to_f32(pe, KV_FP8)
        lat = lat.to(q_lat.dtype)
        pe = pe.to(q_pe.dtype)
        qk = tl.dot(q_lat, tl.trans(lat), input_precision=PRECISION)
        qk = tl.dot(q_pe, pe, acc=qk, input_precision=PRECISION) * sm_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, lat, m_i, l_i, acc, PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    lse = m_i + tl.log(l_safe)  # -inf for an empty split
    tl.store(
        Mid_O
        + b * stride_mob
        + offs_h[:, None] * stride_moh
        + split * stride_mos
        + offs_r[None, :],
        acc / l_safe[:, None] * v_scale,
        mask=mask_h[:, None] & mask_r[None, :],
    )
    tl.store(Mid_Lse + b * stride_mlb + offs_h * stride_mlh + split, lse, mask=mask_h)


def mla_decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    rank: int,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scaling: float,
    num_splits: int,
    block_n: int | None = None,
    block_h: int = MLA_BLOCK_H,
    window: int = 0,
    kv_scale: float = 1.0,
) -> torch.Tensor:
    """Decode attention of one token per request over a latent KV pool.

    Args:
        q: [B, H, R + Dr] (fp32/fp16/bf16), the absorbed latent query then the rope query,
            heads contiguous.
        k_buf: [num_slots, 1, R + Dr], each row [latent (R) ; rope key (Dr)], rows at any
            stride with unit inner stride; its first R columns are the values. rank: R.
        req_to_token: int32 [rows, context]; req_pool_indices, seq_lens: int64 [B], seq_len >= 1.
        scaling: softmax scale. num_splits: key splits per request (`num_kv_splits` with
            cdiv(H, block_h) in place of the KV heads).
        block_n: keys per tile (default 32 on GPU, 16 under the interpreter). block_h: query
            heads per program (>= 16: `tl.dot`'s smallest M).
        window: sliding window (each request sees its last `window` keys); 0 for none.
        kv_scale: an fp8 pool's scale of this layer (keys and values alike: read value =
            code * scale, folded into the softmax scale and the output).
    Returns:
        [B, H, R] in q's dtype; fp32 accumulation. Workspace: fp32 [B, H, S, R] + [B, H, S].
    Grid: stage 1 (B, cdiv(H, block_h), S), stage 2 (B, H); BLOCK_R = max(16, pow2(R)),
        BLOCK_PE = max(16, pow2(Dr)). Raises ValueError when the shapes disagree.
    """
    bsz, heads, dim = q.shape
    rope = dim - rank
    if k_buf.shape[1:] != (1, dim) or rope < 1 or k_buf.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError(
            f"MLA decode needs q [B, H, R + Dr] and k_buf [slots, 1, R + Dr] with Dr >= 1 and "
            f"unit inner strides; got q {tuple(q.shape)}, k_buf {tuple(k_buf.shape)}, R={rank}"
        )
    block_n = block_n or (16 if interpreting() else 32)
    mid_o, mid_lse, out = split_workspace(q, num_splits, rank)
    grid = (bsz, triton.cdiv(heads, block_h), num_splits)
    code = fp8_code(k_buf.dtype)
    k_buf = kernel_view(k_buf)
    _mla_decode_split_kernel[grid](
        q, k_buf, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse,
        scaling * kv_scale, kv_scale,
        q.stride(0), q.stride(1), k_buf.stride(0), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        window,
        HEADS=heads, RANK=rank, ROPE=rope, NUM_SPLITS=num_splits, BLOCK_H=block_h,
        BLOCK_N=block_n, BLOCK_R=max(16, next_pow2(rank)), BLOCK_PE=max(16, next_pow2(rope)),
        PRECISION=dot_precision(q.dtype), SLIDING=window > 0, KV_FP8=code,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    merge_splits(mid_o, mid_lse, out)
    return out
