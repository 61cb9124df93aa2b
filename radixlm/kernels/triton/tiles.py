"""Device functions shared by the paged attention kernels: one key tile through the
request-to-token table, and one online-softmax step over it; fp8 KV codes to and from
float32 (`KV_FP8`: 0 none, 1 e4m3fn, 2 e5m2; buffers passed as uint8 views).

fp8 reads are exact through binary16: an e5m2 code is a binary16's high byte, and an
e4m3fn code's exponent and mantissa moved into a binary16's fields read 2^-8 of its value
(normal and subnormal alike), as in `kernels/cpu/fp8.h`. Writes round to nearest even
with integer arithmetic on the float32 bits, as torch's cast does (input already clamped
to the format's range; NaN not handled).
"""

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
    KV_FP8: tl.constexpr,
):
    """K^T [BLOCK_DK, BLOCK_N] (columns `offs_d`) and V [BLOCK_N, BLOCK_DV] (columns
    `offs_dv`) of KV head `kvh` at positions `offs_n` of table row `row`; masked positions
    read 0 and touch no slot. fp8 codes (KV_FP8 > 0) come back as float32, unscaled."""
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
    if KV_FP8 > 0:
        k = fp8_to_f32(k, KV_FP8)
        v = fp8_to_f32(v, KV_FP8)
    return k, v


@triton.jit
def fp8_to_f32(x, KV_FP8: tl.constexpr):
    """uint8 fp8 codes (KV_FP8 1: e4m3fn, 2: e5m2) as float32, exactly (module doc)."""
    b = x.to(tl.uint16)
    if KV_FP8 == 1:
        h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
        return h.to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    else:
        return (b << 8).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def f32_to_fp8(x, KV_FP8: tl.constexpr):
    """float32 x, |x| <= the format's largest finite value, as uint8 fp8 codes rounded to
    nearest even (KV_FP8 1: e4m3fn, 3 mantissa bits, bias 7; 2: e5m2, 2 and 15).

    Normal results round the float32 bits at the format's last mantissa bit (a carry
    moves into the exponent); below the smallest normal, 2^(1 - bias), the code is
    |x| / 2^(1 - bias - mantissa bits) rounded to an integer (float32 x + 2^23 - 2^23
    rounds to nearest even), which reaches the smallest normal's code at the top."""
    if KV_FP8 == 1:
        MANT: tl.constexpr = 3
        BIAS: tl.constexpr = 7
        SUB_STEP_INV: tl.constexpr = 512.0  # 2^(bias - 1 + mantissa bits)
    else:
        MANT: tl.constexpr = 2
        BIAS: tl.constexpr = 15
        SUB_STEP_INV: tl.constexpr = 65536.0
    SHIFT: tl.constexpr = 23 - MANT
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    lsb = (a >> SHIFT) & 1
    normal = ((a + (1 << (SHIFT - 1)) - 1 + lsb) >> SHIFT) - ((127 - BIAS) << MANT)
    # Only |x| below the smallest normal takes this path (a code <= 2^MANT); the clamp
    # keeps the other lanes' discarded integer cast in range.
    mag = tl.minimum(tl.abs(x) * SUB_STEP_INV, 1024.0)
    sub = ((mag + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a >= ((128 - BIAS) << 23), normal, sub)
    return (code | sign).to(tl.uint8)


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
