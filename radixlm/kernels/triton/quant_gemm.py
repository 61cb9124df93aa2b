"""Quantized linear products y = x W^T on GPU: W4A16 (int4 weight-only, group scales), W8A8
int8 and W8A8 fp8 (e4m3), on the canonical layouts of `radixlm.kernels.quant_ref`, which is
the reference each launcher must match.

* `w4a16_gemm`: the packed nibbles are unpacked in the kernel. A tile of BLOCK_K inputs is
  split into its even and odd columns (the low and high nibbles of BLOCK_K / 2 bytes), so
  each byte is read once and no register shuffle is needed: acc += x_even @ lo + x_odd @ hi.
  When a tile lies inside one group (group_size % BLOCK_K == 0) the integer weights
  (q - zero) are multiplied in x's dtype (exact: |q - zero| <= 15) and the group scale is
  applied to the fp32 partial product; otherwise each weight is dequantized before the dot.
* `w8a8_int8_gemm`: a per-token quantization kernel (round half to even, as `torch.round`,
  with correctly rounded division, so the int8 activations equal the reference's), then an
  int8 x int8 -> int32 `tl.dot` GEMM whose epilogue applies act scale x weight scale.
* `w8a8_fp8_gemm`: per-token e4m3 quantization in the same kernel, then `torch._scaled_mm`
  on devices of compute capability >= 8.9, else a Triton GEMM. All fp8 handling in Triton is
  on the bit patterns (uint8), which every architecture and the interpreter support: an
  e4m3 byte shifted into an fp16 bit pattern is the value times 2^-8 (the exponent biases
  differ by 8; subnormals included), so tiles decode to exact fp16 and the 2^16 of two
  operands is restored in the epilogue.

Tiles (`Tiles`, chosen by `_tiles`): decode (M <= 16) and mid-size M take narrow M tiles and
split K over a third grid axis until the grid fills the device's SMs once (fp32 / int32
partials summed in torch); prefill (M > 64) takes 128 x 128 tiles without split.

Tensors must be on CUDA, or on CPU under `TRITON_INTERPRET=1` (tests); a CPU tensor
otherwise raises ValueError, since the CPU path is `kernels.cpu`'s packed GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.kernels.quant_ref import FP8_E4M3_MAX, INT8_MAX
from radixlm.kernels.triton.common import dot_precision, interpreting

__all__ = ["Tiles", "w4a16_gemm", "w8a8_fp8_gemm", "w8a8_int8_gemm"]

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Tiles:
    """Block sizes (powers of two; block_k >= 32) and the number of K splits."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4


def _tiles(m: int, n: int, k: int, block_k: int, device: torch.device) -> Tiles:
    """The tile table. `block_k` caps BLOCK_K (a group size for W4A16)."""
    if m > 64:
        return Tiles(128, 128, min(64, block_k), 1, 8)
    block_m = 16 if m <= 16 else 64
    block_k = min(128 if m <= 16 else 64, block_k)
    sms = 1
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, 64)
    # Each split keeps at least 4 K tiles, so the partial sums stay a small extra traffic.
    split = max(1, min(triton.cdiv(sms, tiles), k // (4 * block_k)))
    return Tiles(block_m, 64, block_k, split, 4)


@triton.jit
def _rne(v):
    """Round half to even (`torch.round`) of fp32 v, |v| < 2^22 (v + 0.5 is then exact)."""
    r = tl.floor(v + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(((r - v) == 0.5) & odd, r - 1.0, r)


@triton.jit
def _e4m3_bits(v):
    """The e4m3fn byte (uint8) of fp32 v, |v| <= 448, rounded to nearest even: |v| is
    rounded on the e4m3 grid by powers of two (exact), then |v| * 2^-8 is an exact fp16
    whose bits 13..7 are the byte's low 7; the sign is v's (so -0 stays -0)."""
    bits = v.to(tl.int32, bitcast=True)
    a = tl.abs(v)
    e = ((bits >> 23) & 0xFF) - 127
    ulp_exp = tl.maximum(e, -6) - 3  # 3 mantissa bits; subnormals below 2^-6
    inv_ulp = ((127 - ulp_exp) << 23).to(tl.float32, bitcast=True)
    ulp = ((127 + ulp_exp) << 23).to(tl.float32, bitcast=True)
    r = _rne(a * inv_ulp) * ulp
    h = (r * 0.00390625).to(tl.float16).to(tl.int16, bitcast=True)
    return (((bits >> 24) & 0x80) | ((h >> 7) & 0x7F)).to(tl.uint8)


@triton.jit
def _e4m3_to_f16(b):
    """e4m3fn bytes (uint8) -> fp16 equal to the values times 2^-8 (NaN bytes not handled)."""
    h = b.to(tl.int16)
    return (((h & 0x80) << 8) | ((h & 0x7F) << 7)).to(tl.float16, bitcast=True)


@triton.jit
def _quant_act_kernel(
    X, XQ, Scale, Static, K, stride_xm, stride_xk, stride_qm,
    FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Row program_id(0) of x: its scale (absmax / QMAX, 1 for a zero row, or the static
    one) to Scale[row], its int8 values or e4m3 bytes to XQ[row]."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = X + row * stride_xm
    if STATIC:
        s = tl.load(Static).to(tl.float32)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_row + (k0 + offs) * stride_xk, mask=k0 + offs < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        s = tl.math.div_rn(tl.max(amax, 0), QMAX)
        s = tl.where(s > 0.0, s, 1.0)
    tl.store(Scale + row, s)
    for k0 in range(0, K, BLOCK):
        mask = k0 + offs < K
        x = tl.load(x_row + (k0 + offs) * stride_xk, mask=mask, other=0.0)
        v = tl.math.div_rn(x.to(tl.float32), s)
        if FP8:
            q = _e4m3_bits(tl.minimum(tl.maximum(v, -QMAX), QMAX))
        else:
            q = tl.minimum(tl.maximum(_rne(v), -QMAX), QMAX).to(tl.int8)
        tl.store(XQ + row * stride_qm + k0 + offs, q, mask=mask)


@triton.jit
def _w4a16_kernel(
    X, QP, S, Z, Y, M, N, K, G, K_SPLIT,
    stride_xm, stride_xk, stride_qn, stride_qk, stride_sn, stride_sg, stride_zn, stride_zg,
    stride_ys, stride_ym, stride_yn,
    TILE_IN_GROUP: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Y[split, m, n] = sum over k in split program_id(2)'s K range of x[m, k] W[n, k] for
    the (m, n) tile (program_id(0), program_id(1)); W = scale * (q - zero) by group."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, BLOCK_K // 2)  # byte j of the tile holds inputs 2j and 2j + 1
    m_mask, n_mask = offs_m < M, offs_n < N
    x_rows = X + offs_m.to(tl.int64)[:, None] * stride_xm
    q_cols = QP + offs_n.to(tl.int64)[None, :] * stride_qn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_SPLIT
    for k0 in range(k_start, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
        kk = k0 + 2 * offs_j  # even inputs; K is even, so kk + 1 < K with them
        k_mask = kk < K
        xm = m_mask[:, None] & k_mask[None, :]
        x_even = tl.load(x_rows + kk[None, :] * stride_xk, mask=xm, other=0.0)
        x_odd = tl.load(x_rows + (kk + 1)[None, :] * stride_xk, mask=xm, other=0.0)
        wm = k_mask[:, None] & n_mask[None, :]
        p = tl.load(q_cols + (kk // 2)[:, None] * stride_qk, mask=wm, other=0).to(tl.int32)
        if TILE_IN_GROUP:
            g = k0 // G
            s = tl.load(S + offs_n * stride_sn + g * stride_sg, mask=n_mask, other=0.0)
            z = tl.load(Z + offs_n * stride_zn + g * stride_zg, mask=n_mask, other=0)
            z = z.to(tl.int32)[None, :]
            part = tl.dot(x_even, ((p & 15) - z).to(x_even.dtype), input_precision=PRECISION)
            part = tl.dot(x_odd, ((p >> 4) - z).to(x_even.dtype), part, input_precision=PRECISION)
            acc += part * s.to(tl.float32)[None, :]
        else:
            g = (kk // G)[:, None]
            s = tl.load(S + offs_n[None, :] * stride_sn + g * stride_sg, mask=wm, other=0.0)
            z = tl.load(Z + offs_n[None, :] * stride_zn + g * stride_zg, mask=wm, other=0)
            z, s = z.to(tl.int32), s.to(tl.float32)
            w_lo = (((p & 15) - z).to(tl.float32) * s).to(x_even.dtype)
            w_hi = (((p >> 4) - z).to(tl.float32) * s).to(x_even.dtype)
            acc = tl.dot(x_even, w_lo, acc, input_precision=PRECISION)
            acc = tl.dot(x_odd, w_hi, acc, input_precision=PRECISION)
    y = (
        Y
        + pid_k * stride_ys
        + offs_m.to(tl.int64)[:, None] * stride_ym
        + offs_n[None, :] * stride_yn
    )
    tl.store(y, acc.to(Y.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _w8a8_kernel(
    A, B, AScale, BScale, Y, M, N, K, K_SPLIT,
    stride_am, stride_bn, stride_bk, stride_ys, stride_ym, stride_yn,
    FP8: tl.constexpr, EPILOGUE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """acc = A[m, :] . B[n, :] over split program_id(2)'s K range (A, B int8, or e4m3 bytes
    decoded to fp16 x 2^-8); Y = acc * a_scale[m] * b_scale[n] with EPILOGUE, else the raw
    partial (int32, or fp32 without the 2^16)."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    a_rows = A + offs_m.to(tl.int64)[:, None] * stride_am
    b_cols = B + offs_n.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32 if FP8 else tl.int32)
    k_start = pid_k * K_SPLIT
    for k0 in range(k_start, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
        k_mask = k0 + offs_k < K
        am = m_mask[:, None] & k_mask[None, :]
        a = tl.load(a_rows + (k0 + offs_k)[None, :], mask=am, other=0)
        bm = k_mask[:, None] & n_mask[None, :]
        b = tl.load(b_cols + (k0 + offs_k)[:, None] * stride_bk, mask=bm, other=0)
        if FP8:
            acc = tl.dot(_e4m3_to_f16(a), _e4m3_to_f16(b), acc)
        else:
            acc = tl.dot(a, b, acc)
    y = (
        Y
        + pid_k * stride_ys
        + offs_m.to(tl.int64)[:, None] * stride_ym
        + offs_n[None, :] * stride_yn
    )
    if EPILOGUE:
        out = acc.to(tl.float32) * 65536.0 if FP8 else acc.to(tl.float32)
        sa = tl.load(AScale + offs_m, mask=m_mask, other=0.0)
        sb = tl.load(BScale + offs_n, mask=n_mask, other=0.0)
        out = out * sa[:, None] * sb[None, :]
        tl.store(y, out.to(Y.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
    else:
        tl.store(y, acc, mask=m_mask[:, None] & n_mask[None, :])


def _check_common(x: torch.Tensor, k: int, *others: torch.Tensor) -> None:
    """x [M, K] in ACT_DTYPES, every tensor on x's device, CUDA unless interpreting."""
    if x.dim() != 2 or x.dtype not in ACT_DTYPES:
        raise ValueError(f"x must be [M, K] fp16/bf16/fp32, got {tuple(x.shape)} {x.dtype}")
    if x.shape[1] != k:
        raise ValueError(f"x has K = {x.shape[1]} inputs, the weight {k}")
    if any(t.device != x.device for t in others):
        raise ValueError("x and the weight tensors must be on one device")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"the Triton quantized GEMMs need CUDA tensors, got {x.device} "
            "(on CPU the packed C GEMM of radixlm.kernels.cpu computes these layers)"
        )


def _check_scale(t: torch.Tensor, numel: int, name: str) -> None:
    if t.dtype != torch.float32 or t.numel() != numel:
        raise ValueError(f"{name} must be float32 with {numel} elements, got {t.dtype} {t.numel()}")


def _quantize(x: torch.Tensor, static: torch.Tensor | None, fp8: bool) -> tuple[torch.Tensor, ...]:
    """x [M, K] -> (int8 [M, K], or uint8 e4m3 bytes; scale float32 [M]) as `quant_ref`."""
    m, k = x.shape
    xq = torch.empty(m, k, dtype=torch.uint8 if fp8 else torch.int8, device=x.device)
    scale = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        block = min(triton.next_power_of_2(k), 1024)
        _quant_act_kernel[(m,)](
            x, xq, scale, static if static is not None else scale, k,
            x.stride(0), x.stride(1), xq.stride(0),
            FP8=fp8, QMAX=FP8_E4M3_MAX if fp8 else INT8_MAX, STATIC=static is not None,
            BLOCK=block,
        )  # fmt: skip
    return xq, scale


def _check_tiles(tiles: Tiles | None) -> None:
    """Raises ValueError for tiles tl.dot cannot take."""
    if tiles is None:
        return
    sizes = (tiles.block_m, tiles.block_n, tiles.block_k)
    if any(b & (b - 1) for b in sizes) or min(sizes[:2]) < 16 or tiles.block_k < 32:
        raise ValueError(f"{tiles}: blocks must be powers of two, M and N >= 16, K >= 32")
    if tiles.split_k < 1:
        raise ValueError(f"{tiles}: split_k must be >= 1")


def _splits(k: int, tiles: Tiles) -> tuple[int, int]:
    """(K range per split, a multiple of block_k; number of non-empty splits)."""
    k_split = triton.cdiv(triton.cdiv(k, tiles.block_k), tiles.split_k) * tiles.block_k
    return k_split, triton.cdiv(k, k_split)


def w4a16_gemm(
    x: torch.Tensor,
    qpacked: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    *,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """y = x W^T for the W4A16 layout (`quant_ref.w4a16_ref`).

    Args:
        x: [M, K] fp16, bf16 or fp32. qpacked: uint8 [N, K / 2] (low nibble = even input).
        scales: float32 [N, K / G]. zeros: uint8 [N, K / G] (8 for symmetric schemes).
        group_size: G, even and dividing K. tiles: override the tile table (block_k >= 32).
    Returns [M, N] in x's dtype; products accumulate in fp32 (tl.dot on x's dtype, exact
    fp32 for fp32 x). Grid (cdiv(M, BM), cdiv(N, BN), splits).
    Raises ValueError for shapes, dtypes, devices, tiles or a group size not dividing K.
    """
    if qpacked.dim() != 2 or qpacked.dtype != torch.uint8:
        raise ValueError(f"qpacked must be uint8 [N, K / 2], got {qpacked.dtype}")
    n, k = qpacked.shape[0], 2 * qpacked.shape[1]
    _check_common(x, k, qpacked, scales, zeros)
    _check_tiles(tiles)
    if group_size <= 0 or group_size % 2 or k % group_size:
        raise ValueError(f"group size {group_size} must be even and divide K = {k}")
    groups = (n, k // group_size)
    if tuple(scales.shape) != groups or scales.dtype != torch.float32:
        raise ValueError(f"scales must be float32 {groups}, got {scales.dtype} {scales.shape}")
    if tuple(zeros.shape) != groups or zeros.dtype != torch.uint8:
        raise ValueError(f"zeros must be uint8 {groups}, got {zeros.dtype} {zeros.shape}")
    m = x.shape[0]
    cap = 128
    while cap > 32 and group_size % cap:
        cap //= 2  # the largest BLOCK_K in 32..128 that divides G, else 32 (weights dequantized)
    tiles = tiles or _tiles(m, n, k, cap, x.device)
    k_split, splits = _splits(k, tiles)
    out_dtype = x.dtype if splits == 1 else torch.float32
    y = torch.empty(splits, m, n, dtype=out_dtype, device=x.device)
    if m == 0:
        return y[0] if splits == 1 else y.sum(0).to(x.dtype)
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), splits)
    _w4a16_kernel[grid](
        x, qpacked, scales, zeros, y, m, n, k, group_size, k_split,
        x.stride(0), x.stride(1), qpacked.stride(0), qpacked.stride(1),
        scales.stride(0), scales.stride(1), zeros.stride(0), zeros.stride(1),
        y.stride(0), y.stride(1), y.stride(2),
        TILE_IN_GROUP=group_size % tiles.block_k == 0, PRECISION=dot_precision(x.dtype),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps,
    )  # fmt: skip
    return y[0] if splits == 1 else y.sum(0).to(x.dtype)


def _w8a8_checks(x, q, w_scale, act_scale, tiles, qdtype: torch.dtype) -> None:
    if q.dim() != 2 or q.dtype != qdtype:
        raise ValueError(f"q must be {qdtype} [N, K], got {q.dtype} {tuple(q.shape)}")
    _check_common(x, q.shape[1], q, w_scale, *([act_scale] if act_scale is not None else []))
    _check_scale(w_scale, q.shape[0], "w_scale")
    if act_scale is not None:
        _check_scale(act_scale, 1, "act_scale")
    _check_tiles(tiles)


def _w8a8_triton(xq, xs, q, w_scale, out_dtype, fp8: bool, tiles: Tiles | None):
    """The Triton GEMM of quantized activations xq [M, K] and weights q [N, K] (int8, or
    e4m3 bytes as uint8) with the scale epilogue; [M, N] in out_dtype."""
    m, k = xq.shape
    n = q.shape[0]
    w_scale = w_scale.reshape(-1).contiguous()
    tiles = tiles or _tiles(m, n, k, 128, xq.device)
    k_split, splits = _splits(k, tiles)
    acc_dtype = torch.float32 if fp8 else torch.int32
    y = torch.empty(splits, m, n, dtype=out_dtype if splits == 1 else acc_dtype, device=xq.device)
    if m:
        grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), splits)
        _w8a8_kernel[grid](
            xq, q, xs, w_scale, y, m, n, k, k_split,
            xq.stride(0), q.stride(0), q.stride(1), y.stride(0), y.stride(1), y.stride(2),
            FP8=fp8, EPILOGUE=splits == 1,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_warps=tiles.num_warps,
        )  # fmt: skip
    if splits == 1:
        return y[0]
    acc = y.sum(0, dtype=acc_dtype).float()
    if fp8:
        acc = acc * 65536.0
    return (acc * xs[:, None] * w_scale.reshape(1, -1)).to(out_dtype)


def w8a8_int8_gemm(
    x: torch.Tensor,
    q: torch.Tensor,
    w_scale: torch.Tensor,
    act_scale: torch.Tensor | None = None,
    *,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """y = x W^T for the W8A8 int8 layout (`quant_ref.w8a8_int8_ref`).

    Args:
        x: [M, K] fp16, bf16 or fp32. q: int8 [N, K]. w_scale: float32 [N].
        act_scale: a float32 one-element static activation scale, or None for dynamic
            per-token absmax / 127. tiles: override the tile table (block_k >= 32).
    Returns [M, N] in x's dtype: int32 accumulation (exact for K < 133,000), then
    acc * act_scale[m] * w_scale[n] in fp32.
    Raises ValueError for shapes, dtypes, devices or tiles.
    """
    _w8a8_checks(x, q, w_scale, act_scale, tiles, torch.int8)
    xq, xs = _quantize(x, act_scale, fp8=False)
    return _w8a8_triton(xq, xs, q, w_scale, x.dtype, False, tiles)


def _scaled_mm_ok(x: torch.Tensor, n: int, k: int) -> bool:
    """Whether `torch._scaled_mm` runs here: fp8 tensor cores (sm 8.9+), N and K % 16."""
    if x.device.type != "cuda" or n % 16 or k % 16 or x.shape[0] == 0:
        return False
    return torch.cuda.get_device_capability(x.device) >= (8, 9)


def w8a8_fp8_gemm(
    x: torch.Tensor,
    q: torch.Tensor,
    w_scale: torch.Tensor,
    act_scale: torch.Tensor | None = None,
    *,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """y = x W^T for the W8A8 fp8 layout (`quant_ref.w8a8_fp8_ref`).

    Args:
        x: [M, K] fp16, bf16 or fp32. q: float8_e4m3fn [N, K]. w_scale: float32 [N].
        act_scale: a float32 one-element static activation scale, or None for dynamic
            per-token absmax / 448. tiles: override the Triton fallback's tile table.
    Returns [M, N] in x's dtype, products in fp32. On sm 8.9+ `torch._scaled_mm` multiplies
    (row-wise scales for bf16 output on sm 9.0+; else unit scales, fp32 output, and the
    scales applied after); elsewhere, and under the interpreter, the Triton GEMM.
    Raises ValueError for shapes, dtypes, devices or tiles.
    """
    _w8a8_checks(x, q, w_scale, act_scale, tiles, torch.float8_e4m3fn)
    xq, xs = _quantize(x, act_scale, fp8=True)
    n, k = q.shape
    if not _scaled_mm_ok(x, n, k):
        return _w8a8_triton(xq, xs, q.view(torch.uint8), w_scale, x.dtype, True, tiles)
    a, b = xq.view(torch.float8_e4m3fn), q.contiguous().t()  # b column-major, as required
    if x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0):
        sb = w_scale.reshape(1, -1).contiguous()
        return torch._scaled_mm(a, b, xs[:, None], sb, out_dtype=torch.bfloat16)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    acc = torch._scaled_mm(a, b, one, one, out_dtype=torch.float32)
    return (acc * xs[:, None] * w_scale.reshape(1, -1)).to(x.dtype)
