"""MoE: expert activation by batch, memory vs bandwidth bills."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixlm.plan.moe import (
    ExpertLayout,
    batch_all_experts_active,
    expert_traffic,
    moe_batch_table,
    moe_bills,
)
from radixlm.plan.weights import (
    distinct_experts,
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


def test_distinct_experts_by_hand():
    assert distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert distinct_experts(8, 2, 4) == pytest.approx(5.46875)  # 8 (1 - 0.75^4)
    assert distinct_experts(64, 8, 2) == pytest.approx(64 * (1 - (56 / 64) ** 2))  # 15.0
    assert distinct_experts(64, 8, 2) == pytest.approx(15.0)
    assert distinct_experts(8, 8, 3) == 8.0 and distinct_experts(8, 2, 0) == 0.0


def test_expert_traffic_against_dense_by_hand():
    layout = ExpertLayout(num_experts=8, top_k=2, hidden=512, intermediate=1024, layers=4)
    expert_bytes = 3 * 512 * 1024 * 4  # fp32: 6,291,456 bytes per expert
    rows = expert_traffic(layout, (1, 4, 1000), "fp32")
    assert [r["distinct_experts"] for r in rows] == pytest.approx([2.0, 5.46875, 8.0])
    assert rows[0]["moe_bytes"] == 4 * 2 * expert_bytes == 50_331_648
    assert rows[1]["moe_bytes"] == pytest.approx(137_625_600)  # 4 x 5.46875 experts
    for r in rows:
        assert r["dense_same_active_bytes"] == 50_331_648
        assert r["dense_same_total_bytes"] == 201_326_592
    assert rows[0]["moe_over_dense_active"] == 1.0
    assert rows[2]["moe_over_dense_total"] == pytest.approx(1.0)


def test_expert_traffic_counts_the_shared_expert_every_step():
    # Qwen1.5-MoE-A2.7B's shape: 60 experts top-4 of width 1408, a shared one of 5632.
    layout = ExpertLayout(60, 4, 2048, 1408, layers=24, shared_intermediate=5632)
    (one,) = expert_traffic(layout, (1,), "bf16")
    # 24 layers x (4 x 8,650,752 + 34,603,008 params) x 2 bytes
    assert one["moe_bytes"] == one["dense_same_active_bytes"] == 3_321_888_768
    assert one["dense_same_total_bytes"] == 24 * (60 * 8_650_752 + 34_603_008) * 2


def test_layout_of_a_model_and_bad_layouts(specs):
    mixtral = ExpertLayout.of(specs["Mixtral-8x7B"])
    assert (mixtral.num_experts, mixtral.top_k, mixtral.intermediate, mixtral.layers) == (
        8, 2, 14336, 32,
    )  # fmt: skip
    deepseek = ExpertLayout.of(specs["DeepSeek-V3"])
    assert (deepseek.layers, deepseek.shared_intermediate) == (58, 2048)  # 61 - 3 dense
    with pytest.raises(ValueError, match="dense"):
        ExpertLayout.of(specs["Llama-3-8B"])
    with pytest.raises(ValueError, match="top_k"):
        ExpertLayout(4, 5, 8, 8)
    with pytest.raises(ValueError, match="hidden"):
        ExpertLayout(4, 2, 0, 8)
