"""Paged extend attention: new tokens attend over their request's cached prefix plus
themselves, with a causal mask or a custom (tree) mask for speculative verification.

Every key, prefix or new, is read from the KV pool through the request-to-token table (the
new tokens' K/V were stored before the call), so any page size works.

Kernel `_extend_kernel`, grid (B, H, cdiv(max_extend_len, BLOCK_M)): program (b, h, m)
handles query rows [m * BLOCK_M, (m + 1) * BLOCK_M) of request b's n_b new tokens for query
head h (KV head h // group), over keys [0, kv_end) in BLOCK_N-key tiles with an online
softmax. Causal: new token j (position p_b + j) sees keys 0..p_b + j, so kv_end stops at
p_b + (m + 1) * BLOCK_M. Custom mask: kv_end = s_b and key k is visible to row j iff
custom_mask[mask_indptr[b] + j * s_b + k]. A row that sees no key outputs 0.

Sliding window W > 0 (`SLIDING`): key k is also hidden from a row at position i unless
i - k < W, i = p_b + j (causal) or positions[token] (custom mask), and the key loop starts
at the block's first row's first key, max(0, min_i - W + 1). Without a window the
compiled variant is the plain one.

Reference: `TorchNativeBackend.forward_extend` / `forward_verify` (per-request SDPA with
the same masks). Online softmax after Milakov & Gimelshein 2018 and FlashAttention (Dao 2022).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.common import dot_precision, interpreting, next_pow2
from radixlm.kernels.triton.store_kv import fp8_code, kernel_view
from radixlm.kernels.triton.tiles import load_kv_tile, online_softmax_step


@triton.jit
def _extend_kernel(
    Q,  # [T, H, Dk]
    Out,  # [T, H, Dv]
    K_Buf,  # [num_slots, Hkv, Dk]
    V_Buf,  # [num_slots, Hkv, Dv] (may be a view of K_Buf's first Dv columns)
    Req_to_token,  # int32 [rows, context]
    Req_pool_indices,  # int64 [B]
    Seq_lens,  # int64 [B]
    Prefix_lens,  # int64 [B]
    Qo_indptr,  # int64 [B + 1]
    Custom_mask,  # uint8 [sum n_b * s_b] (unused unless USE_CUSTOM_MASK)
    Mask_indptr,  # int64 [B + 1]
    Positions,  # int64 [T] (read only when SLIDING and USE_CUSTOM_MASK)
    sm_scale,  # the softmax scale times an fp8 pool's K scale
    v_scale,  # an fp8 pool's V scale (1.0 otherwise)
    window,  # sliding window (read only when SLIDING)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_r2t,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_CUSTOM_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    SLIDING: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mblk = tl.program_id(2)
    kvh = h // GROUP
    q_start = tl.load(Qo_indptr + b)
    ext_len = (tl.load(Qo_indptr + b + 1) - q_start).to(tl.int32)
    prefix = tl.load(Prefix_lens + b).to(tl.int32)
    seq_len = tl.load(Seq_lens + b).to(tl.int32)
    row = tl.load(Req_pool_indices + b).to(tl.int64)

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < ext_len
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < HEAD_DIM_V
    q = tl.load(
        Q + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )
    if USE_CUSTOM_MASK:
        kv_end = seq_len
        mask_base = tl.load(Mask_indptr + b)
    else:
        kv_end = tl.minimum(seq_len, prefix + (mblk + 1) * BLOCK_M)
    kv_end = tl.where(mblk * BLOCK_M < ext_len, kv_end, 0)  # blocks past n_b do nothing
    kv_start = 0
    if SLIDING:
        if USE_CUSTOM_MASK:
            pos = tl.load(Positions + q_start + offs_m, mask=mask_m, other=0).to(tl.int32)
            first = tl.min(tl.where(mask_m, pos, seq_len), 0)
        else:
            pos = prefix + offs_m
            first = prefix + mblk * BLOCK_M
        kv_start = tl.maximum(first - window + 1, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for n0 in range(kv_start, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        k, v = load_kv_tile(
            K_Buf, V_Buf, Req_to_token, row, stride_r2t, kvh, stride_ks, stride_kh,
            stride_vs, stride_vh, offs_n, mask_n, offs_d, mask_d, offs_dv, mask_dv, KV_FP8,
        )  # fmt: skip
        qk = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * sm_scale
        if USE_CUSTOM_MASK:
            visible = (
                tl.load(
                    Custom_mask + mask_base + offs_m[:, None] * seq_len + offs_n[None, :],
                    mask=mask_m[:, None] & mask_n[None, :],
                    other=0,
                )
                != 0
            )
        else:
            visible = (offs_n[None, :] <= prefix + offs_m[:, None]) & mask_n[None, :]
        if SLIDING:
            visible = visible & (pos[:, None] - offs_n[None, :] < window)
        qk = tl.where(visible, qk, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, v.to(q.dtype), m_i, l_i, acc, PRECISION)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * v_scale
    tl.store(
        Out + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_dv[None, :],
        out.to(Out.dtype.element_ty),
        mask=mask_m[:, None] & mask_dv[None, :],
    )


def extend_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    max_extend_len: int,
    scaling: float,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    window: int = 0,
    positions: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Extend (or tree-verify) attention of T new tokens over their requests' paged K/V.

    Args:
        q: [T, H, Dk] new tokens grouped by request (fp32/fp16/bf16).
        k_buf: [num_slots, Hkv, Dk], v_buf: [num_slots, Hkv, Dv] (any strides, e.g. the view
            k_buf[:, :, :Dv] of a latent pool) holding prefix and new K/V; H % Hkv == 0.
        req_to_token: int32 [rows, context]. req_pool_indices, seq_lens, prefix_lens: int64 [B]
            (seq_len = prefix_len + n_b). qo_indptr: int64 [B + 1] prefix sum of n_b.
        max_extend_len: max n_b (sizes the grid). scaling: softmax scale.
        custom_mask: bool [sum n_b * s_b] row-major per request, with mask_indptr int64 [B + 1];
            None for causal attention.
        block_m, block_n: tile sizes (default 64/64 on GPU, 16/16 under the interpreter).
        window: sliding window (the token at position i sees keys k with i - k < window);
            0 for none. positions: int64 [T], each token's position, needed with a window
            and a custom mask (key index k counts as position k); else unused.
        k_scale, v_scale: an fp8 pool's scales of this layer (`decode_attention`).
    Returns:
        [T, H, Dv] in q's dtype; fp32 accumulation.
    Grid: (B, H, cdiv(max_extend_len, BLOCK_M)); BLOCK_D = pow2(Dk), BLOCK_DV = pow2(Dv).
    """
    _, heads, dim = q.shape
    bsz = req_pool_indices.numel()
    small = interpreting()
    block_m = block_m or (16 if small else 64)
    block_n = block_n or (16 if small else 64)
    use_mask = custom_mask is not None
    if use_mask:
        custom_mask = custom_mask.view(torch.uint8)
    else:
        custom_mask, mask_indptr = qo_indptr, qo_indptr  # placeholders, never read
    sliding = window > 0
    if sliding and use_mask and positions is None:
        raise ValueError("a sliding window over a custom mask needs the tokens' positions")
    if positions is None:
        positions = qo_indptr  # placeholder, never read
    dim_v = v_buf.shape[2]
    out = q.new_empty(q.shape[0], heads, dim_v)
    grid = (bsz, heads, triton.cdiv(max(max_extend_len, 1), block_m))
    code = fp8_code(k_buf.dtype)
    kv_heads = k_buf.shape[1]
    k_buf, v_buf = kernel_view(k_buf), kernel_view(v_buf)
    _extend_kernel[grid](
        q, out, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, prefix_lens, qo_indptr,
        custom_mask, mask_indptr, positions, scaling * k_scale, v_scale, window,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0),
        GROUP=heads // kv_heads, HEAD_DIM=dim, HEAD_DIM_V=dim_v, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=next_pow2(dim), BLOCK_DV=next_pow2(dim_v),
        USE_CUSTOM_MASK=use_mask, PRECISION=dot_precision(q.dtype),
        SLIDING=sliding, KV_FP8=code, num_warps=4, num_stages=2,
    )  # fmt: skip
    return out
