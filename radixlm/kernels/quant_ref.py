"""Torch reference of the quantized linear products, on radixlm's canonical in-memory layout.

Every checkpoint format (compressed-tensors, GPTQ, AWQ) is converted at load into one of
these layouts; the CPU GEMM (`kernels.cpu`) and the Triton kernels (`kernels.triton`) read
them (or repack them) and are tested against these functions.

Layouts, for a linear y = x W^T with W [N, K] (N output features, K input features):

* W4A16 (int4 weight-only, group-wise, asymmetric or symmetric):
  ``qpacked`` uint8 [N, K / 2], weight (n, 2j) in the low nibble and (n, 2j + 1) in the
  high nibble, values 0..15; ``scales`` float32 [N, K / G]; ``zeros`` uint8 [N, K / G]
  (0..15; symmetric schemes store 8); W[n, k] = scales[n, k // G] * (q[n, k] -
  zeros[n, k // G]). Group size G divides K and is even.
* W8A8 int8: ``q`` int8 [N, K] and per-output-channel ``w_scale`` float32 [N]
  (W = w_scale[:, None] * q); activations quantized per token, symmetric, to int8 in
  [-127, 127] (dynamic: scale = absmax(row) / 127) or with one static float32 scale;
  products accumulate exactly in int32 and are scaled back in float32.
* W8A8 fp8: ``q`` float8_e4m3fn [N, K] and ``w_scale`` float32 [N] (per channel; a
  per-tensor scale is broadcast to [N]); activations quantized per token to e4m3
  (dynamic: scale = absmax(row) / 448) or with one static scale; products in float32.

Sources: the int4 group scheme is GPTQ's (Frantar et al., 2022) and AWQ's (Lin et al.,
2023) as stored by the compressed-tensors ``pack-quantized`` format; W8A8 with dynamic
per-token activation scales is SmoothQuant's (Xiao et al., 2022) int8 layout and the fp8
scheme vLLM serves (``FP8_DYNAMIC`` in llm-compressor's presets).
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
FP8_E4M3_MAX = 448.0


def unpack_int4(qpacked: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K / 2] -> uint8 [N, K] (values 0..15, low nibble first)."""
    lo, hi = qpacked & 15, qpacked >> 4
    return torch.stack([lo, hi], dim=-1).reshape(qpacked.shape[0], -1)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] with values 0..15 (K even) -> uint8 [N, K / 2]; inverse of `unpack_int4`.
    Raises ValueError for odd K or values above 15."""
    if q.shape[-1] % 2 or int(q.max()) > 15:
        raise ValueError("pack_int4 needs an even K and values 0..15")
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def dequant_w4(
    qpacked: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The fp32 weight [N, K] of a W4A16 layout (see the module docstring)."""
    q = unpack_int4(qpacked).float()
    s = scales.float().repeat_interleave(group_size, dim=1)
    z = zeros.float().repeat_interleave(group_size, dim=1)
    return s * (q - z)


def w4a16_ref(
    x: torch.Tensor,
    qpacked: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """x [M, K] (any float dtype) -> y [M, N] float32 = x W^T in float32."""
    return x.float() @ dequant_w4(qpacked, scales, zeros, group_size).t()


def _act_scale(xf: torch.Tensor, static_scale: torch.Tensor | None, qmax: float) -> torch.Tensor:
    """Per-token activation scale float32 [M, 1] of xf [M, K]: absmax / qmax (1 for an
    all-zero row), or `static_scale` broadcast to every row."""
    if static_scale is not None:
        return static_scale.float().reshape(1, 1).expand(xf.shape[0], 1)
    scale = xf.abs().amax(dim=1, keepdim=True) / qmax
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quant_act_int8(
    x: torch.Tensor, static_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq int8 [M, K] in [-127, 127], scale float32 [M, 1]); per-token absmax
    scaling unless `static_scale` (a float32 scalar tensor) is given. An all-zero row gets
    scale 1."""
    xf = x.float()
    scale = _act_scale(xf, static_scale, INT8_MAX)
    xq = torch.round(xf / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return xq, scale


def w8a8_int8_ref(
    x: torch.Tensor,
    q: torch.Tensor,
    w_scale: torch.Tensor,
    act_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K], q int8 [N, K], w_scale float32 [N] -> y [M, N] float32: int8 activations
    times int8 weights accumulated exactly (int64 here, int32 in the kernels: |sum| <=
    127 * 127 * K fits int32 for K < 133,000), then scaled by act scale x w_scale."""
    xq, xs = quant_act_int8(x, act_scale)
    acc = xq.long() @ q.long().t()
    return acc.float() * xs * w_scale.float().reshape(1, -1)


def quant_act_fp8(
    x: torch.Tensor, static_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq float8_e4m3fn [M, K], scale float32 [M, 1]); per-token absmax / 448
    unless `static_scale` is given; values beyond the format's range saturate."""
    xf = x.float()
    scale = _act_scale(xf, static_scale, FP8_E4M3_MAX)
    xq = (xf / scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return xq, scale


def w8a8_fp8_ref(
    x: torch.Tensor,
    q: torch.Tensor,
    w_scale: torch.Tensor,
    act_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K], q float8_e4m3fn [N, K], w_scale float32 [N] -> y [M, N] float32:
    fp8 activations times fp8 weights in float32, scaled by act scale x w_scale."""
    xq, xs = quant_act_fp8(x, act_scale)
    acc = xq.float() @ q.float().t()
    return acc * xs * w_scale.float().reshape(1, -1)
