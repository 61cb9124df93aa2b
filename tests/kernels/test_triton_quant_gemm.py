"""The Triton quantized GEMMs (`kernels.triton.quant_gemm`) against the torch reference
(`kernels.quant_ref`): W4A16 within fp32 / half accumulation tolerance, the quantized
activations bit for bit, W8A8 int8 exact up to the final float scaling, W8A8 fp8 within
accumulation tolerance; bad input raises ValueError."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import quant_ref

pytest.importorskip("triton")

from radixlm.kernels.triton import quant_gemm  # noqa: E402
from radixlm.kernels.triton.quant_gemm import (  # noqa: E402
    Tiles,
    w4a16_gemm,
    w8a8_fp8_gemm,
    w8a8_int8_gemm,
)

SHAPES = [(32, 64), (48, 128)]  # (N, K)


def w4_layout(n: int, k: int, group: int, symmetric: bool, seed: int = 0):
    """A random W4A16 layout: (qpacked, scales, zeros)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.1 + 0.01
    if symmetric:
        zeros = torch.full((n, k // group), 8, dtype=torch.uint8)
    else:
        zeros = torch.randint(0, 16, (n, k // group), generator=g, dtype=torch.uint8)
    return quant_ref.pack_int4(q), scales, zeros


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    """Random activations with a zero row (scale 1) when there are several rows."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    if m > 1:
        x[1] = 0.0
    return x


def on(device, *tensors):
    return [t.to(device) for t in tensors]


def assert_half_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp16 / bf16 output against the fp32 reference: half rounding of the inputs and the
    output, relative to the output's largest magnitude."""
    eps = torch.finfo(got.dtype).eps
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float().cpu(), want, rtol=4 * eps, atol=4 * eps * scale)


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize(("n", "k", "group"), [(32, 64, 32), (48, 128, 64), (48, 128, 32)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_w4a16_matches_reference(m, n, k, group, symmetric, device):
    qpacked, scales, zeros = w4_layout(n, k, group, symmetric)
    x = activations(m, k)
    want = quant_ref.w4a16_ref(x, qpacked, scales, zeros, group)
    got = w4a16_gemm(*on(device, x, qpacked, scales, zeros), group)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 33])
def test_w4a16_half_activations(dtype, m, device):
    if dtype == torch.bfloat16 and device == "cpu":
        pytest.skip("the Triton interpreter's tl.dot multiplies bf16 tiles' raw bits")
    qpacked, scales, zeros = w4_layout(48, 128, 64, symmetric=False)
    x = activations(m, 128).to(dtype)
    want = quant_ref.w4a16_ref(x, qpacked, scales, zeros, 64)
    got = w4a16_gemm(*on(device, x, qpacked, scales, zeros), 64)
    assert got.dtype == dtype
    assert_half_close(got, want)


@pytest.mark.parametrize(
    ("k", "group", "tiles"),
    [
        (128, 32, Tiles(16, 32, 32, split_k=3)),  # split K, one group per tile
        (128, 64, Tiles(16, 32, 64, split_k=2)),
        (64, 16, Tiles(16, 32, 32)),  # groups narrower than a tile: weights dequantized
        (96, 48, Tiles(16, 32, 64, split_k=2)),  # group straddling tiles, K not a tile multiple
    ],
)
def test_w4a16_split_k_and_per_weight_groups(k, group, tiles, device):
    qpacked, scales, zeros = w4_layout(48, k, group, symmetric=False, seed=2)
    x = activations(5, k)
    want = quant_ref.w4a16_ref(x, qpacked, scales, zeros, group)
    got = w4a16_gemm(*on(device, x, qpacked, scales, zeros), group, tiles=tiles)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quantized_activations_equal_reference(fp8, dtype, device):
    ref = quant_ref.quant_act_fp8 if fp8 else quant_ref.quant_act_int8
    x = (activations(6, 200) * 3).to(dtype)
    x[2, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.5])
    static = torch.tensor(0.5 if fp8 else 1.0)  # row 2: ties at every rounding
    for act_scale in (None, static):
        want_q, want_s = ref(x, act_scale)
        got_q, got_s = quant_gemm._quantize(
            x.to(device), act_scale.to(device) if act_scale is not None else None, fp8
        )
        want_q = want_q.view(torch.uint8) if fp8 else want_q
        assert torch.equal(got_q.cpu(), want_q)
        assert torch.equal(got_s.cpu(), want_s[:, 0])


def test_e4m3_encoding_of_every_value_and_midpoint(device):
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()].unique()  # sorted, -448..448
    mids = (values[1:] + values[:-1]) / 2  # exact in fp32: ties to even
    quarter = values[:-1] + (values[1:] - values[:-1]) / 4
    x = torch.cat([values, mids, quarter, torch.randn(300) * 100])[None]
    want = quant_ref.quant_act_fp8(x, torch.tensor(1.0))[0].view(torch.uint8)
    got, _ = quant_gemm._quantize(x.to(device), torch.tensor(1.0, device=device), fp8=True)
    assert torch.equal(got.cpu(), want)


def int8_weights(n: int, k: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    return q, torch.rand(n, generator=g) * 0.01 + 1e-3


def fp8_weights(n: int, k: int, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 60).clamp(-448, 448)
    return w.to(torch.float8_e4m3fn), torch.rand(n, generator=g) * 0.01 + 1e-3


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("static", [False, True])
def test_w8a8_int8_exact_up_to_scaling(m, n, k, static, device):
    q, w_scale = int8_weights(n, k)
    x = activations(m, k)
    act_scale = torch.tensor(0.02) if static else None  # static: |x| > 2.54 clips
    want = quant_ref.w8a8_int8_ref(x, q, w_scale, act_scale)
    args = on(device, x, q, w_scale) + ([act_scale.to(device)] if static else [])
    got = w8a8_int8_gemm(*args)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=0)
    split = w8a8_int8_gemm(*args, tiles=Tiles(16, 32, 32, split_k=2))
    torch.testing.assert_close(split.cpu(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("static", [False, True])
def test_w8a8_fp8_matches_reference(m, n, k, static, device):
    q, w_scale = fp8_weights(n, k)
    x = activations(m, k)
    act_scale = torch.tensor(0.005) if static else None  # static: |x| > 2.24 saturates
    want = quant_ref.w8a8_fp8_ref(x, q, w_scale, act_scale)
    args = on(device, x, q, w_scale) + ([act_scale.to(device)] if static else [])
    tol = dict(rtol=1e-4, atol=1e-4 * want.abs().max().item())  # fp32 sums in any order
    torch.testing.assert_close(w8a8_fp8_gemm(*args).cpu(), want, **tol)
    split = w8a8_fp8_gemm(*args, tiles=Tiles(16, 32, 32, split_k=2))
    torch.testing.assert_close(split.cpu(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_w8a8_half_activations(dtype, device):
    x = activations(5, 128).to(dtype)
    q, w_scale = int8_weights(48, 128)
    got = w8a8_int8_gemm(*on(device, x, q, w_scale))
    assert got.dtype == dtype
    want = quant_ref.w8a8_int8_ref(x, q, w_scale)
    if dtype == torch.bfloat16 and device == "cpu":  # the interpreter truncates to bf16
        torch.testing.assert_close(got.float(), want, rtol=torch.finfo(dtype).eps, atol=0)
    else:  # the same fp32 value rounded once to the output dtype
        assert torch.equal(got.cpu(), want.to(dtype))
    q8, w_scale8 = fp8_weights(48, 128)
    got = w8a8_fp8_gemm(*on(device, x, q8, w_scale8))
    assert got.dtype == dtype
    assert_half_close(got, quant_ref.w8a8_fp8_ref(x, q8, w_scale8))


def test_bad_input_raises(device):
    qpacked, scales, zeros = on(device, *w4_layout(32, 64, 32, symmetric=True))
    x = torch.randn(3, 64, device=device)
    w4_cases = [
        (x[:, :32], qpacked, scales, zeros, 32),  # K mismatch
        (x.long(), qpacked, scales, zeros, 32),  # activation dtype
        (x, qpacked.view(torch.int8), scales, zeros, 32),  # packed dtype
        (x, qpacked, scales, zeros, 24),  # group not dividing K
        (x, qpacked, scales, zeros, 0),
        (x, qpacked, scales.half(), zeros, 32),  # scale dtype
        (x, qpacked, scales, zeros[:, :1], 32),  # zeros shape
        (x[0], qpacked, scales, zeros, 32),  # x not [M, K]
    ]
    for args in w4_cases:
        with pytest.raises(ValueError):
            w4a16_gemm(*args)
    q, w_scale = on(device, *int8_weights(32, 64))
    q8 = q.float().to(torch.float8_e4m3fn)
    w8_cases = [
        (w8a8_int8_gemm, (x, q8, w_scale)),  # int8 GEMM given fp8 weights
        (w8a8_fp8_gemm, (x, q, w_scale)),
        (w8a8_int8_gemm, (x, q, w_scale[:16])),  # one scale per output channel
        (w8a8_int8_gemm, (x, q, w_scale.double())),
        (w8a8_int8_gemm, (x, q, w_scale, torch.ones(2, device=device))),  # static: one value
        (w8a8_fp8_gemm, (x[:, :48], q8, w_scale)),
    ]
    for fn, args in w8_cases:
        with pytest.raises(ValueError):
            fn(*args)


def test_cpu_tensors_outside_the_interpreter_raise(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(2, 64)
    q, w_scale = int8_weights(32, 64)
    with pytest.raises(ValueError, match="CUDA"):
        w8a8_int8_gemm(x, q, w_scale)
    with pytest.raises(ValueError, match="CUDA"):
        w4a16_gemm(x, *w4_layout(32, 64, 32, symmetric=True), 32)


def test_strided_activations_and_bad_tiles(device):
    x = activations(40, 24).to(device).t()  # [24, 40]: K strided, M contiguous
    qpacked, scales, zeros = on(device, *w4_layout(32, 40, 20, symmetric=False))
    want = quant_ref.w4a16_ref(x.cpu(), *on("cpu", qpacked, scales, zeros), 20)
    got = w4a16_gemm(x, qpacked, scales, zeros, 20)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    q, w_scale = int8_weights(32, 40)
    got = w8a8_int8_gemm(x, *on(device, q, w_scale))
    torch.testing.assert_close(
        got.cpu(), quant_ref.w8a8_int8_ref(x.cpu(), q, w_scale), rtol=1e-6, atol=0
    )
    for tiles in (Tiles(16, 32, 16), Tiles(8, 32, 32), Tiles(16, 48, 32), Tiles(16, 32, 32, 0)):
        with pytest.raises(ValueError):
            w8a8_int8_gemm(x, *on(device, q, w_scale), tiles=tiles)
