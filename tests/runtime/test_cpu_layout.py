"""The CPU weight layouts give the nn.Linear results for every row count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radixlm.runtime.models.cpu_layout import (
    FEW_ROWS,
    FewRowsHead,
    InputMajorLinear,
    use_cpu_layout,
)


@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS, FEW_ROWS + 1, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_layouts_match_linear(rows, bias):
    torch.manual_seed(0)
    head = nn.Linear(64, 1000, bias=bias)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(FewRowsHead(head)(x), head(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(InputMajorLinear(head)(x), head(x), rtol=1e-5, atol=1e-5)


def test_model_conversion_keeps_tied_head_and_counts_the_copy():
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed = nn.Embedding(1000, 64)
    model.model.proj = nn.Linear(64, 32)
    model.lm_head = nn.Linear(64, 1000, bias=False)
    model.lm_head.weight = model.model.embed.weight
    params_before = sum(p.numel() for p in model.parameters())
    extra = use_cpu_layout(model)
    assert extra == 1000 * 64 * 4
    assert isinstance(model.model.proj, InputMajorLinear)
    assert model.model.proj.weight_t.shape == (64, 32)
    assert model.lm_head.weight is model.model.embed.weight
    assert "lm_head.weight_t" not in model.state_dict()  # a runtime copy, never saved
    assert sum(p.numel() for p in model.parameters()) == params_before
