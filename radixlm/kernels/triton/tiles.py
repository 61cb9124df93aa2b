"""Device functions shared by the paged attention kernels: one key tile through the
request-to-token table, and one online-softmax step over it."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
    K_Buf,
    V_Buf,
    Req_to_token,
    row,
    stride_r2t,
    kvh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    offs_n,
    mask_n,
    offs_d,
    mask_d,
    offs_dv,
    mask_dv,
):
    """K^T [BLOCK_DK, BLOCK_N] (columns `offs_d`) and V [BLOCK_N, BLOCK_DV] (columns
    `offs_dv`) of KV head `kvh` at positions `offs_n` of table row `row`; masked positions
    read 0 and touch no slot."""
    slots = tl.load(Req_to_token + row * stride_r2t + offs_n, mask=mask_n, other=0)
    slots = slots.to(tl.int64)
    k = tl.load(
        K_Buf + slots[None, :] * stride_ks + kvh * stride_kh + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None],
        other=0.0,
    )
    v = tl.load(
        V_Buf + slots[:, None] * stride_vs + kvh * stride_vh + offs_dv[None, :],
        mask=mask_n[:, None] & mask_dv[None, :],
        other=0.0,
    )
    return k, v


@triton.jit
def online_softmax_step(qk, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """Fold one tile into the running (max, normaliser, output) of each query row.

    qk: fp32 [M, N] scaled scores, -inf where hidden; v: [N, D] in the matmul dtype;
    m_i, l_i: fp32 [M]; acc: fp32 [M, D]. A row with no visible key so far keeps m = -inf,
    l = 0, acc = 0 (its exponentials are taken against 0, never -inf - -inf).
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(qk - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
