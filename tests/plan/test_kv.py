"""KV bytes per token on published numbers, layouts, and TP replication."""

from __future__ import annotations

import pytest

from radixlm.plan.kv import (
    compare_models,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_heads_per_gpu,
    kv_replication,
    layout_variants,
    mla_expanded_bytes_per_token,
)


def test_llama3_70b_bf16(specs):
    # 80 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes
    assert kv_bytes_per_token(specs["Llama-3-70B"], "bf16") == 327_680


def test_deepseek_v3_mla_bf16(specs):
    # 61 layers x (512 latent + 64 RoPE key) x 2 bytes
    assert kv_bytes_per_token(specs["DeepSeek-V3"], "bf16") == 70_272


def test_smollm2_fp32_matches_engine_layout(specs):
    # 30 layers x 3 KV heads x 64 dims x 2 x 4 bytes (the engine's fp32 CPU pool)
    assert kv_bytes_per_token(specs["smollm2"], "fp32") == 46_080


@pytest.mark.parametrize(("dtype", "factor"), [("fp32", 2.0), ("fp8", 0.5), ("int8", 0.5)])
def test_dtype_scaling(specs, dtype, factor):
    m = specs["Llama-3-8B"]
    assert kv_bytes_per_token(m, dtype) == factor * kv_bytes_per_token(m, "bf16")


def test_per_sequence(specs):
    m = specs["Llama-3-8B"]
    assert kv_bytes_per_token(m) == 131_072
    assert kv_bytes_per_sequence(m, 8192) == 131_072 * 8192  # 1 GiB


def test_mla_expanded_is_much_larger(specs):
    m = specs["DeepSeek-V3"]
    # 61 x 128 heads x (128 + 64 + 128) x 2 bytes
    assert mla_expanded_bytes_per_token(m) == 61 * 128 * 320 * 2
    assert mla_expanded_bytes_per_token(m) / kv_bytes_per_token(m) == pytest.approx(71.1, 0.01)


def test_layout_variants_gqa(specs):
    rows = {r.layout: r for r in layout_variants(specs["Llama-3-70B"])}
    assert rows["mha"].bytes_per_token == 8 * 327_680
    assert rows["mqa"].bytes_per_token == 327_680 / 8
    assert rows["gqa (model)"].ratio_to_model == 1.0


def test_mla_holds_more_context_than_dense_70b(specs):
    rows = compare_models([specs["DeepSeek-V3"], specs["Llama-3-70B"]], "bf16", 8192)
    assert rows[1]["ratio_to_first"] == pytest.approx(327_680 / 70_272)
    assert rows[0]["tokens_per_gib"] > 4 * rows[1]["tokens_per_gib"]


def test_tp_splits_kv_heads(specs):
    m = specs["Llama-3-70B"]  # 8 KV heads
    assert [kv_heads_per_gpu(m, tp) for tp in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert kv_bytes_per_token_per_gpu(m, "bf16", 8) == 327_680 / 8
    assert kv_replication(m, 8) == 1.0


def test_gqa_replicates_when_tp_exceeds_kv_heads(specs):
    m = specs["Qwen2.5-7B"]  # 4 KV heads
    assert kv_heads_per_gpu(m, 8) == 1
    assert kv_replication(m, 8) == 2.0
    # tp=8 costs the same per GPU as tp=4: the split stops at one head per GPU
    assert kv_bytes_per_token_per_gpu(m, "bf16", 8) == kv_bytes_per_token_per_gpu(m, "bf16", 4)
    assert kv_replication(specs["Llama-3-70B"], 16) == 2.0


def test_mla_latent_replicated_under_tp(specs):
    m = specs["DeepSeek-V3"]
    assert kv_bytes_per_token_per_gpu(m, "bf16", 8) == 70_272
    assert kv_replication(m, 8) == 8.0
