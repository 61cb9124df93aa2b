"""Quantized panels (GGUF Q4_1 / Q8_0 kept packed): the packing round-trips, the C
dequantization gives the gguf package's fp32 values, and the GEMM equals the fp32 packed
GEMM bit for bit on every row count and instruction set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlm.kernels.cpu import pack_panels, quant

FORMATS = [quant.Q4_1, quant.Q8_0]


def random_blocks(n: int, k: int, fmt: int, seed: int = 0) -> torch.Tensor:
    """GGUF blocks of a random W [n, k]: random quants, small positive d, signed m."""
    g = torch.Generator().manual_seed(seed)
    bb = quant.BLOCK_BYTES[fmt]
    raw = torch.randint(0, 256, (n, k // 32 * bb), dtype=torch.uint8, generator=g)
    blocks = raw.view(n, k // 32, bb)
    d = torch.rand(n, k // 32, generator=g).mul(0.01).add(1e-3).half()
    blocks[:, :, 0:2] = d.unsqueeze(-1).view(torch.uint8)
    if fmt == quant.Q4_1:
        m = torch.randn(n, k // 32, generator=g).mul(0.05).half()
        blocks[:, :, 2:4] = m.unsqueeze(-1).view(torch.uint8)
    return raw


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_blocks_equals_the_gguf_package(fmt):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = random_blocks(32, 96, fmt)
    kind = GGMLQuantizationType.Q4_1 if fmt == quant.Q4_1 else GGMLQuantizationType.Q8_0
    want = torch.from_numpy(np.ascontiguousarray(dequantize(raw.numpy(), kind)))
    assert torch.equal(quant.dequantize_blocks(raw, fmt, 96), want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_panels_round_trip_and_c_dequantization(fmt, gemm_isa, cpu_kernels):
    n, k = 48, 160
    raw = random_blocks(n, k, fmt, seed=1)
    w = quant.dequantize_blocks(raw, fmt, k)
    panels = quant.pack_blocks(raw, fmt, k)
    assert (
        panels.shape == (n // 16, k // 32, quant.GROUP_BYTES[fmt]) and panels.dtype == torch.uint8
    )
    assert torch.equal(quant.dequantize_panels(panels, fmt, n, k), w)
    for b in range(n // 16):  # panel b holds columns 16b..16b+15 of W^T
        assert torch.equal(cpu_kernels.dequantize(panels[b], fmt), w[16 * b : 16 * b + 16].t())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(16, 32), (960, 576), (576, 1536), (64, 1056)])
def test_quantized_gemm_equals_fp32_panels_bit_for_bit(fmt, n, k, gemm_isa, cpu_kernels):
    """Both paths: the in-place row tiles (< 24 rows) and the blocked path (from 24)."""
    raw = random_blocks(n, k, fmt, seed=n + k)
    w = quant.dequantize_blocks(raw, fmt, k)
    fp32, panels = pack_panels(w), quant.pack_blocks(raw, fmt, k)
    torch.manual_seed(0)
    for rows in (1, 2, 5, 12, 23, 24, 37, 150, 300):
        x = torch.randn(rows, k)
        got = cpu_kernels.qmm(x, panels, fmt, n)
        assert torch.equal(got, cpu_kernels.mm(x, fp32, n)), rows
        torch.testing.assert_close(got, x @ w.t(), rtol=1e-4, atol=1e-4)


def test_quantized_gemm_reads_strided_rows_and_zero_rows(cpu_kernels):
    raw = random_blocks(32, 64, quant.Q4_1, seed=5)
    panels = quant.pack_blocks(raw, quant.Q4_1, 64)
    w = quant.dequantize_blocks(raw, quant.Q4_1, 64)
    wide = torch.randn(30, 100)
    for rows in (3, 30):  # strided rows in place, then copied for the blocked path
        x = wide[:rows, 10:74]
        assert torch.equal(cpu_kernels.qmm(x, panels, quant.Q4_1, 32),
                           cpu_kernels.mm(x.contiguous(), pack_panels(w), 32))  # fmt: skip
    assert cpu_kernels.qmm(torch.empty(0, 64), panels, quant.Q4_1, 32).shape == (0, 32)


def test_bad_shapes_and_formats_raise(cpu_kernels):
    raw = random_blocks(32, 64, quant.Q8_0)
    panels = quant.pack_blocks(raw, quant.Q8_0, 64)
    with pytest.raises(ValueError, match="do not hold"):
        cpu_kernels.qmm(torch.randn(2, 96), panels, quant.Q8_0, 32)  # K mismatch
    with pytest.raises(ValueError, match="do not hold"):
        cpu_kernels.qmm(torch.randn(2, 64), panels, quant.Q4_1, 32)  # wrong format
    with pytest.raises(ValueError, match="float32"):
        cpu_kernels.qmm(torch.randn(2, 64).double(), panels, quant.Q8_0, 32)
    with pytest.raises(ValueError, match="N % 16"):
        quant.pack_blocks(random_blocks(24, 64, quant.Q8_0), quant.Q8_0, 64)
    with pytest.raises(ValueError, match="uint8"):
        quant.pack_blocks(raw[:, :-1], quant.Q8_0, 64)
    with pytest.raises(ValueError, match="unknown"):
        quant.pack_blocks(raw, 7, 64)
