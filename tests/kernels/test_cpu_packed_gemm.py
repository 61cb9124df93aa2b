"""The packed CPU GEMM equals torch's x @ W^T for every row tile, K block and ragged N."""

from __future__ import annotations

import subprocess

import pytest
import torch

import radixlm.kernels.cpu as cpu
from radixlm.kernels.cpu import PackedGemm, pack_panels


@pytest.fixture(scope="module")
def gemm():
    g = PackedGemm.load()
    if g is None:
        pytest.skip("the packed CPU GEMM cannot be built here (no compiler or no AVX2)")
    return g


def test_pack_panels_layout():
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    p = pack_panels(w)
    assert p.shape == (2, 3, 16)
    assert torch.equal(p[0], w[:16].t())
    assert torch.equal(p[1, :, :4], w[16:].t())
    assert not p[1, :, 4:].any()  # zero padding


# Rows cover tiles of 1-6 rows, balanced splits above 6 and K blocking (K > 128);
# N covers exact panels, a ragged last panel and N < 16.
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 40])
@pytest.mark.parametrize("n,k", [(64, 32), (200, 300), (7, 129), (1000, 576)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_torch(gemm, m, n, k, threads):
    torch.manual_seed(m * 1000 + n + k)
    w, x = torch.randn(n, k), torch.randn(m, k)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = gemm.mm(x, pack_panels(w), n)
    finally:
        torch.set_num_threads(before)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-5, atol=1e-4)


def test_non_contiguous_input_and_zero_rows(gemm):
    w = torch.randn(48, 40)
    x = torch.randn(40, 6).t()  # [6, 40], not contiguous
    torch.testing.assert_close(gemm.mm(x, pack_panels(w), 48), x @ w.t(), rtol=1e-5, atol=1e-4)
    assert gemm.mm(torch.empty(0, 40), pack_panels(w), 48).shape == (0, 48)


def test_bad_input_is_a_value_error(gemm):
    p = pack_panels(torch.randn(32, 8))
    with pytest.raises(ValueError, match="fp32 only"):
        gemm.mm(torch.randn(2, 8, dtype=torch.float64), p, 32)
    with pytest.raises(ValueError, match="K=9"):
        gemm.mm(torch.randn(2, 9), p, 32)


def test_build_failure_falls_back_to_none(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setattr(cpu, "_unsupported_reason", lambda: None)
    assert PackedGemm.load() is None
    assert not list(tmp_path.glob("*.so"))


def test_build_is_cached(monkeypatch, tmp_path, gemm):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    so = cpu._build()
    assert so.parent == tmp_path and so.exists()
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    assert cpu._build() == so and not calls
