"""The CPU weight layouts give the nn.Linear results for every row count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radixlm.kernels.cpu import PackedGemm
from radixlm.runtime.models import cpu_layout
from radixlm.runtime.models.cpu_layout import (
    FEW_ROWS,
    FewRowsHead,
    InputMajorLinear,
    PackedHead,
    PackedLinear,
    use_cpu_layout,
)


@pytest.fixture(scope="module")
def gemm():
    g = PackedGemm.load()
    if g is None:
        pytest.skip("the packed CPU GEMM cannot be built here")
    return g


@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS, FEW_ROWS + 1, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_input_major_layouts_match_linear(rows, bias):
    torch.manual_seed(0)
    head = nn.Linear(64, 1000, bias=bias)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(FewRowsHead(head)(x), head(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(InputMajorLinear(head)(x), head(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_layouts_match_linear(gemm, monkeypatch, rows, bias):
    torch.manual_seed(1)
    head = nn.Linear(64, 1000, bias=bias)
    x = torch.randn(rows, 64)
    monkeypatch.setattr(cpu_layout, "PACKED_HEAD_ROWS", 20)  # 40 rows take F.linear
    torch.testing.assert_close(PackedHead(head, gemm)(x), head(x), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(PackedLinear(head, gemm)(x), head(x), rtol=1e-5, atol=1e-4)


def _tiny_tied_model() -> nn.Module:
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed = nn.Embedding(1000, 64)
    model.model.proj = nn.Linear(64, 40)  # 40 outputs: the last panel holds 8 padding columns
    model.lm_head = nn.Linear(64, 1000, bias=False)
    model.lm_head.weight = model.model.embed.weight
    return model


def test_input_major_conversion_keeps_tied_head_and_counts_the_copy():
    model = _tiny_tied_model()
    params_before = sum(p.numel() for p in model.parameters())
    extra = use_cpu_layout(model, None)
    assert extra == 1000 * 64 * 4
    assert isinstance(model.model.proj, InputMajorLinear)
    assert model.model.proj.weight_t.shape == (64, 40)
    assert model.lm_head.weight is model.model.embed.weight
    assert "lm_head.weight_t" not in model.state_dict()  # a runtime copy, never saved
    assert sum(p.numel() for p in model.parameters()) == params_before


def test_packed_conversion_keeps_tied_head_and_counts_panels_and_padding(gemm):
    model = _tiny_tied_model()
    x = torch.randn(3, 64)
    want = model.model.proj(x)
    extra = use_cpu_layout(model, gemm)
    # The head's panels (1000 columns pad to 63 panels = 1008) plus the projection's padding.
    assert extra == 1008 * 64 * 4 + 8 * 64 * 4
    assert isinstance(model.model.proj, PackedLinear) and isinstance(model.lm_head, PackedHead)
    assert model.lm_head.weight is model.model.embed.weight
    assert "lm_head.panels" not in model.state_dict()
    torch.testing.assert_close(model.model.proj(x), want, rtol=1e-5, atol=1e-4)


def test_other_dtypes_keep_the_input_major_layout(gemm):
    model = _tiny_tied_model().to(torch.bfloat16)
    use_cpu_layout(model, gemm)
    assert isinstance(model.model.proj, InputMajorLinear)
    assert isinstance(model.lm_head, FewRowsHead)
