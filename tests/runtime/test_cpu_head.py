"""The CPU few-rows head gives the nn.Linear logits for every row count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radixlm.runtime.models.cpu_head import FEW_ROWS, FewRowsHead, use_few_rows_head


@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS, FEW_ROWS + 1, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_linear(rows, bias):
    torch.manual_seed(0)
    head = nn.Linear(64, 1000, bias=bias)
    few = FewRowsHead(head)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(few(x), head(x), rtol=1e-5, atol=1e-5)


def test_tied_weight_stays_shared_and_copy_is_counted():
    model = nn.Module()
    model.embed = nn.Embedding(1000, 64)
    model.lm_head = nn.Linear(64, 1000, bias=False)
    model.lm_head.weight = model.embed.weight
    extra = use_few_rows_head(model)
    assert extra == 1000 * 64 * 4
    assert model.lm_head.weight is model.embed.weight
    assert model.lm_head.weight_t.shape == (64, 1000)
    assert "weight_t" not in model.state_dict()  # a runtime layout, never saved
    assert sum(p.numel() for p in model.parameters()) == 1000 * 64
