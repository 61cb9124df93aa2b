"""The canonical quantized layouts' torch reference (`radixlm.kernels.quant_ref`)."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import quant_ref


def test_int4_pack_roundtrip_and_dequant():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (4, 8), generator=g, dtype=torch.uint8)
    packed = quant_ref.pack_int4(q)
    assert packed.shape == (4, 4)
    assert int(packed[0, 0]) == int(q[0, 0]) | (int(q[0, 1]) << 4)
    assert torch.equal(quant_ref.unpack_int4(packed), q)
    scales = torch.tensor([[0.5, 2.0]] * 4)
    zeros = torch.tensor([[8, 3]] * 4, dtype=torch.uint8)
    w = quant_ref.dequant_w4(packed, scales, zeros, group_size=4)
    assert w[1, 2].item() == 0.5 * (int(q[1, 2]) - 8)
    assert w[3, 5].item() == 2.0 * (int(q[3, 5]) - 3)
    with pytest.raises(ValueError):
        quant_ref.pack_int4(torch.full((1, 3), 1, dtype=torch.uint8))


def test_w8a8_int8_is_exact_integer_product():
    x = torch.tensor([[1.0, -2.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q = torch.tensor([[1, 2, 3, 4], [-127, 0, 127, 5]], dtype=torch.int8)
    ws = torch.tensor([0.1, 1.0])
    y = quant_ref.w8a8_int8_ref(x, q, ws)
    xs = 2.0 / 127
    xq = torch.round(x[0] / xs)  # [64, -127, 32, 0]
    assert xq.tolist() == [64.0, -127.0, 32.0, 0.0]
    acc0 = 64 * 1 - 127 * 2 + 32 * 3
    assert y[0, 0].item() == pytest.approx(acc0 * xs * 0.1, rel=1e-6)
    assert y[1].tolist() == [0.0, 0.0]


def test_w8a8_fp8_close_to_float_product():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 64, generator=g)
    w = torch.randn(5, 64, generator=g)
    ws = w.abs().amax(dim=1) / quant_ref.FP8_E4M3_MAX
    q = (w / ws[:, None]).to(torch.float8_e4m3fn)
    y = quant_ref.w8a8_fp8_ref(x, q, ws)
    assert torch.allclose(y, x @ w.t(), rtol=0.1, atol=0.6)
    assert not torch.equal(y, x @ w.t())
