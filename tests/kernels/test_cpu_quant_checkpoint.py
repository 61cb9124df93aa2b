"""The CPU GEMM over the canonical checkpoint layouts (`kernels.cpu.quant` W4G / F8 / I8)
against `kernels.quant_ref`."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import quant_ref
from radixlm.kernels.cpu import CpuKernels, pack_panels, quant

kernels = CpuKernels.load()
pytestmark = pytest.mark.skipif(kernels is None, reason="radixlm's CPU kernels cannot run here")

SHAPES = [(1, 64, 32), (3, 96, 128), (32, 48, 256), (40, 32, 384)]


def _w4(n: int, k: int, group: int, gen: torch.Generator):
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=gen) * 0.1 + 0.01
    zeros = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.uint8)
    return quant_ref.pack_int4(q), scales, zeros


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("group", [32, 64, 128, -1])
def test_w4_panels_equal_fp32_panels_of_the_reference_weight(m, n, k, group):
    gen = torch.Generator().manual_seed(m * n + k)
    g = k if group == -1 else group
    if k % g:
        pytest.skip("group does not divide K")
    qpacked, scales, zeros = _w4(n, k, g, gen)
    x = torch.randn(m, k, generator=gen)
    panels = quant.pack_w4(qpacked, scales, zeros, g)
    w = quant_ref.dequant_w4(qpacked, scales, zeros, g)
    # dequantization is exact: products bit for bit those over fp32 panels of W
    assert torch.equal(kernels.qmm(x, panels, quant.W4G, n), kernels.mm(x, pack_panels(w), n))
    ref = quant_ref.w4a16_ref(x, qpacked, scales, zeros, g)
    torch.testing.assert_close(kernels.qmm(x, panels, quant.W4G, n), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp8_panels_equal_fp32_panels_of_the_reference_weight(m, n, k):
    gen = torch.Generator().manual_seed(7 * m + n + k)
    q = (torch.randn(n, k, generator=gen) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    finite = torch.tensor([b for b in range(256) if b & 127 != 127], dtype=torch.uint8)
    q.view(torch.uint8).view(-1)[: finite.numel()] = finite  # every finite byte, subnormals too
    w_scale = torch.rand(n, generator=gen) * 0.01 + 1e-3
    x = torch.randn(m, k, generator=gen)
    panels = quant.pack_fp8(q, w_scale)
    w = q.float() * w_scale[:, None]
    assert torch.equal(kernels.qmm(x, panels, quant.F8, n), kernels.mm(x, pack_panels(w), n))


@pytest.mark.parametrize("m,n,k", SHAPES + [(5, 16, 4096)])
@pytest.mark.parametrize("static", [False, True])
def test_int8_gemm_equals_reference_exactly(m, n, k, static):
    gen = torch.Generator().manual_seed(3 * m + n + k)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    q[0, :32] = -128  # checkpoints may hold it: |w| is the unsigned operand
    w_scale = torch.rand(n, generator=gen) * 0.01 + 1e-4
    x = torch.randn(m, k, generator=gen) * 3
    x[0, :5] = 0.0
    if m > 2:
        x[2] = 0.0  # an all-zero row: scale 1
    act = torch.tensor(0.02) if static else None
    buf = quant.pack_int8(q, w_scale, act)
    y = kernels.qmm(x, buf, quant.I8, n)
    assert torch.equal(y, quant_ref.w8a8_int8_ref(x, q, w_scale, act))
    # strided rows read the same values
    wide = torch.cat([x, torch.ones(m, 32)], dim=1)
    assert torch.equal(kernels.qmm(wide[:, :k], buf, quant.I8, n), y)


def test_int8_gemm_avx2_path_when_avx512_is_off():
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (32, 64), generator=gen, dtype=torch.int8)
    w_scale, x = torch.rand(32, generator=gen), torch.randn(4, 64, generator=gen)
    before = kernels.gemm_isa()
    try:
        kernels.gemm_isa(False)
        y = kernels.qmm(x, quant.pack_int8(q, w_scale), quant.I8, 32)
    finally:
        kernels.gemm_isa(before == "avx512")
    assert torch.equal(y, quant_ref.w8a8_int8_ref(x, q, w_scale))


def test_packing_rejects_shapes_the_kernels_cannot_hold():
    qpacked, scales, zeros = _w4(16, 64, 16, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.pack_w4(qpacked, scales, zeros, 16)
    with pytest.raises(ValueError, match="N % 16"):
        quant.pack_int8(torch.zeros(8, 64, dtype=torch.int8), torch.ones(8))
