"""Quantized weight panels for the CPU GEMM (`quant_gemm.c`): GGUF's Q4_1 and Q8_0 blocks
regrouped 16 output columns wide, so a decode step streams 0.625 or 1.0625 bytes per weight
instead of fp32's 4 while computing with the file's exact values in fp32.

GGUF block formats (llama.cpp `ggml-common.h`), one block per 32 consecutive weights of a
row of W [N, K]:

* Q4_1, 20 bytes: d, m (IEEE fp16), qs[16]; weight j = d * (qs[j] & 15) + m and weight
  j + 16 = d * (qs[j] >> 4) + m.
* Q8_0, 34 bytes: d (fp16), qs[32] int8; weight j = d * qs[j].

Panel layout (`quant_gemm.c` reads it): uint8 [N / 16, K / 32, GROUP_BYTES[fmt]], each
group of panel b holding columns 16b..16b+15 for 32 k: Q4_1 d[16] and m[16] fp16, then 16
pairs of k rows, byte j = q[2p][j] | q[2p + 1][j] << 4; Q8_0 d[16] fp16, then 32 rows of
16 int8.
"""

from __future__ import annotations

import torch

#: Panel format codes shared with the C kernels (`radixlm_weight_gemm`).
FP32, Q4_1, Q8_0 = 0, 1, 2
#: GGUF block type name -> format code, for the block types the kernels read.
FORMATS = {"Q4_1": Q4_1, "Q8_0": Q8_0}
#: Bytes of one GGUF block (32 weights of a row) and of one packed group (16 x 32 weights).
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}
GROUP_BYTES = {Q4_1: 320, Q8_0: 544}


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
