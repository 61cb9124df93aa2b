"""MoE: expert activation by batch, memory vs bandwidth bills."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixlm.plan.moe import batch_all_experts_active, moe_batch_table, moe_bills
from radixlm.plan.weights import (
    expected_distinct_experts,
    tokens_for_expert_fraction,
    weights_bytes,
    weights_read_bytes,
)


def test_expected_experts(specs):
    m = specs["Mixtral-8x7B"]
    assert expected_distinct_experts(m, 1) == pytest.approx(2.0)
    assert expected_distinct_experts(m, 2) == pytest.approx(8 * (1 - 0.75**2))
    assert expected_distinct_experts(m, 1000) == pytest.approx(8.0)


@given(n=st.integers(1, 5000))
def test_expected_experts_bounds(specs, n):
    m = specs["DeepSeek-V3"]
    e = expected_distinct_experts(m, n)
    assert min(8, n) * 0.999 <= e <= min(256, 8 * n) + 1e-9


def test_all_experts_active(specs):
    assert batch_all_experts_active(specs["Mixtral-8x7B"]) == 8  # ln 8 / -ln 0.75 = 7.2
    assert batch_all_experts_active(specs["DeepSeek-V3"]) == 175  # ln 256 / -ln(31/32)
    assert tokens_for_expert_fraction(specs["DeepSeek-V3"], 0.99) == 146


def test_bills(specs):
    m = specs["Mixtral-8x7B"]
    bills = moe_bills(m)
    assert bills["memory_bytes"] == weights_bytes(m)
    assert bills["memory_bytes"] / 1e9 == pytest.approx(93.4, abs=0.3)  # 46.7B x 2
    # batch 1 reads active params minus the input embedding (a row lookup)
    active_read = (m.active_params() - m.embedding_params()) * 2
    assert bills["bandwidth_bytes_per_token_batch1"] == pytest.approx(active_read)


def test_read_bytes_climb_to_total(specs):
    m = specs["DeepSeek-V3"]
    total_read = weights_bytes(m) - m.embedding_params() * 2
    assert weights_read_bytes(m, 10_000) == pytest.approx(total_read, rel=1e-6)
    rows = moe_batch_table(m, (1, 8, 64, 512))
    per_token = [r["weights_read_per_token"] for r in rows]
    assert per_token == sorted(per_token, reverse=True)
    assert rows[0]["expert_intensity"] == pytest.approx(1.0)  # 2 FLOPs per 2-byte weight


def test_dense_model_reads_all_weights(specs):
    m = specs["Llama-3-8B"]
    assert weights_read_bytes(m, 1) == weights_read_bytes(m, 512)
