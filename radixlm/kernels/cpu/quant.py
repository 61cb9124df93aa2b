"""Quantized weight panels for the CPU GEMM (`quant_gemm.c`, `quant_int8.c`): GGUF's Q4_1
and Q8_0 blocks regrouped 16 output columns wide, so a decode step streams 0.625 or 1.0625
bytes per weight instead of fp32's 4 while computing with the file's exact values in fp32;
and the canonical checkpoint layouts of `kernels.quant_ref` (`pack_w4`, `pack_fp8`,
`pack_int8`).

GGUF block formats (llama.cpp `ggml-common.h`), one block per 32 consecutive weights of a
row of W [N, K]:

* Q4_1, 20 bytes: d, m (IEEE fp16), qs[16]; weight j = d * (qs[j] & 15) + m and weight
  j + 16 = d * (qs[j] >> 4) + m.
* Q8_0, 34 bytes: d (fp16), qs[32] int8; weight j = d * qs[j].

Panel layout (`quant_gemm.c` reads it): uint8 [N / 16, K / 32, GROUP_BYTES[fmt]], each
group of panel b holding columns 16b..16b+15 for 32 k: Q4_1 d[16] and m[16] fp16, then 16
pairs of k rows, byte j = q[2p][j] | q[2p + 1][j] << 4; Q8_0 d[16] fp16, then 32 rows of
16 int8; W4G s[16] fp32, z[16] uint8, then 16 pairs of k rows as Q4_1's (W = s (q - z));
F8 s[16] fp32, then 32 rows of 16 float8_e4m3fn bytes (W = s f8). The int8 format I8 is not
panelled: a 64-byte header (static activation scale fp32, 0 for dynamic), w_scale fp32 [N],
q int8 [N, K] row-major, one flat uint8 buffer.
"""

from __future__ import annotations

import torch

#: Panel format codes shared with the C kernels (`radixlm_weight_gemm`).
FP32, Q4_1, Q8_0, W4G, F8, I8 = 0, 1, 2, 3, 4, 5
#: GGUF block type name -> format code, for the block types the kernels read.
FORMATS = {"Q4_1": Q4_1, "Q8_0": Q8_0}
#: Bytes of one GGUF block (32 weights of a row) and of one packed group (16 x 32 weights).
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}
GROUP_BYTES = {Q4_1: 320, Q8_0: 544, W4G: 336, F8: 576}
#: Bytes of the I8 buffer's header.
I8_HEADER = 64


def _split(raw: torch.Tensor, fmt: int, k: int) -> tuple[torch.Tensor, ...]:
    """raw uint8 [N, K / 32 * block bytes] -> (d fp16 [N, G], m fp16 [N, G] or None,
    q [N, G, 32]: uint8 0..15 for Q4_1, int8 for Q8_0)."""
    n, g = raw.shape[0], k // 32
    blocks = raw.reshape(n, g, BLOCK_BYTES[fmt])
    d = blocks[:, :, 0:2].contiguous().view(torch.float16).reshape(n, g)
    if fmt == Q4_1:
        m = blocks[:, :, 2:4].contiguous().view(torch.float16).reshape(n, g)
        qs = blocks[:, :, 4:20]
        return d, m, torch.cat([qs & 15, qs >> 4], dim=2)
    return d, None, blocks[:, :, 2:34].contiguous().view(torch.int8)


def check_shape(fmt: int, n: int, k: int, raw: torch.Tensor) -> None:
    """Raise ValueError unless raw is uint8 [n, k / 32 * block bytes] of a known format
    with n % 16 == 0 and k % 32 == 0 (what the packed panels need)."""
    if fmt not in BLOCK_BYTES:
        raise ValueError(f"unknown quantized panel format {fmt}")
    if n % 16 or k % 32:
        raise ValueError(f"quantized panels need N % 16 == 0 and K % 32 == 0, got {n} x {k}")
    if raw.dtype != torch.uint8 or tuple(raw.shape) != (n, k // 32 * BLOCK_BYTES[fmt]):
        raise ValueError(f"expected uint8 [{n}, {k // 32 * BLOCK_BYTES[fmt]}] blocks")


def pack_blocks(raw: torch.Tensor, fmt: int, k: int) -> torch.Tensor:
    """GGUF blocks of W [N, K] (raw uint8 [N, K / 32 * block bytes], rows in W's order) ->
    packed panels uint8 [N / 16, K / 32, GROUP_BYTES[fmt]]. Raises ValueError as
    `check_shape`."""
    n = raw.shape[0]
    check_shape(fmt, n, k, raw)
    nb, g = n // 16, k // 32
    d, m, q = _split(raw, fmt, k)

    def by_panel(t: torch.Tensor) -> torch.Tensor:  # [N, G, ...] -> [NB, G, 16, ...]
        return t.reshape(nb, 16, g, *t.shape[2:]).transpose(1, 2)

    parts = [by_panel(d).contiguous().view(torch.uint8).reshape(nb, g, 32)]
    if fmt == Q4_1:
        parts.append(by_panel(m).contiguous().view(torch.uint8).reshape(nb, g, 32))
        qk = by_panel(q).transpose(2, 3)  # [NB, G, 32 k, 16 columns]
        pairs = qk[:, :, 0::2] | (qk[:, :, 1::2] << 4)  # [NB, G, 16 pairs, 16]
        parts.append(pairs.reshape(nb, g, 256))
    else:
        qk = by_panel(q).transpose(2, 3).contiguous().view(torch.uint8)
        parts.append(qk.reshape(nb, g, 512))
    return torch.cat(parts, dim=2).contiguous()


def dequantize_blocks(raw: torch.Tensor, fmt: int, k: int) -> torch.Tensor:
    """GGUF blocks of W [N, K] -> W float32 [N, K], computed as the `gguf` package does
    (fp16 scales to fp32, d * q + m in fp32: d * q is exact, one rounding)."""
    d, m, q = _split(raw, fmt, k)
    w = d.float().unsqueeze(2) * q.float()
    if m is not None:
        w = w + m.float().unsqueeze(2)
    return w.reshape(raw.shape[0], k)


def dequantize_panels(panels: torch.Tensor, fmt: int, n: int, k: int) -> torch.Tensor:
    """Packed panels uint8 [N / 16, K / 32, group bytes] -> W float32 [N, K] (the reference
    the C kernel's dequantization is tested against)."""
    nb, g = n // 16, k // 32
    d = panels[:, :, 0:32].contiguous().view(torch.float16).float()  # [NB, G, 16]
    if fmt == Q4_1:
        m = panels[:, :, 32:64].contiguous().view(torch.float16).float()
        pairs = panels[:, :, 64:320].reshape(nb, g, 16, 16)
        q = torch.stack([pairs & 15, pairs >> 4], dim=3).reshape(nb, g, 32, 16).float()
        w = d.unsqueeze(2) * q + m.unsqueeze(2)
    else:
        q = panels[:, :, 32:544].contiguous().view(torch.int8).reshape(nb, g, 32, 16).float()
        w = d.unsqueeze(2) * q
    # [NB, G, 32 k, 16 cols] -> [NB, 16, G, 32] -> [N, K]
    return w.permute(0, 3, 1, 2).reshape(n, k)


def _check_nk(n: int, k: int) -> None:
    if n % 16 or k % 32:
        raise ValueError(f"quantized panels need N % 16 == 0 and K % 32 == 0, got {n} x {k}")


def _panel_groups(t: torch.Tensor) -> torch.Tensor:
    """[N, K, ...] -> [N / 16, K / 32, 32 k, 16 columns, ...] (columns innermost but one)."""
    n, k = t.shape[:2]
    return t.reshape(n // 16, 16, k // 32, 32, *t.shape[2:]).permute(
        0, 2, 3, 1, *range(4, t.dim() + 2)
    )


def _block_scales(t: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """Per-group [N, K / G] -> per-32-block [N / 16, K / 32, 16] (G a multiple of 32)."""
    per_block = t.repeat_interleave(group_size // 32, dim=1)
    n = t.shape[0]
    return per_block.reshape(n // 16, 16, k // 32).transpose(1, 2)


def pack_w4(
    qpacked: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The canonical W4A16 layout (qpacked uint8 [N, K / 2], scales float32 [N, K / G],
    zeros uint8 [N, K / G]) -> W4G panels uint8 [N / 16, K / 32, 336]. Raises ValueError
    unless N % 16 == 0, K % 32 == 0 and G % 32 == 0 (per-channel: G = K)."""
    n, k = qpacked.shape[0], qpacked.shape[1] * 2
    _check_nk(n, k)
    if group_size % 32 or k % group_size:
        raise ValueError(f"W4G panels need a group size that is a multiple of 32, got {group_size}")
    q = torch.stack([qpacked & 15, qpacked >> 4], dim=2).reshape(n, k)
    qk = _panel_groups(q)  # [NB, G32, 32, 16]
    pairs = (qk[:, :, 0::2] | (qk[:, :, 1::2] << 4)).reshape(n // 16, k // 32, 256)
    s = _block_scales(scales.float(), k, group_size).contiguous().view(torch.uint8)
    z = _block_scales(zeros.to(torch.uint8), k, group_size).contiguous()
    return torch.cat([s, z, pairs], dim=2).contiguous()


def pack_fp8(q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """fp8 weights q float8_e4m3fn [N, K] with per-channel w_scale float32 [N] -> F8 panels
    uint8 [N / 16, K / 32, 576] (W = w_scale q). Raises ValueError on a shape the panels
    cannot hold."""
    n, k = q.shape
    _check_nk(n, k)
    s = w_scale.float().reshape(n, 1).expand(n, k // 32).contiguous()
    s = s.reshape(n // 16, 16, k // 32).transpose(1, 2).contiguous().view(torch.uint8)
    rows = _panel_groups(q.view(torch.uint8)).reshape(n // 16, k // 32, 512)
    return torch.cat([s, rows], dim=2).contiguous()


def pack_int8(
    q: torch.Tensor, w_scale: torch.Tensor, act_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """W8A8 int8 weights q int8 [N, K], w_scale float32 [N] and the static activation scale
    (a positive float32 scalar, or None for dynamic per-token scales) -> the I8 buffer uint8
    [64 + 4 N + N K]. Raises ValueError on a shape the kernel cannot take."""
    n, k = q.shape
    _check_nk(n, k)
    head = torch.zeros(I8_HEADER // 4, dtype=torch.float32)
    if act_scale is not None:
        head[0] = float(act_scale)
    parts = [head, w_scale.float().reshape(n)]
    return torch.cat(
        [p.contiguous().view(torch.uint8) for p in parts]
        + [q.contiguous().view(torch.uint8).reshape(-1)]
    )
