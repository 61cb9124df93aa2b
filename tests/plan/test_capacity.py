"""Weights bytes, KV budget and token capacity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixlm.plan.capacity import (
    capacity,
    capacity_table,
    gpus_for_weights,
    kv_budget_per_gpu,
    max_decode_batch,
    min_tp_that_fits,
    tokens_that_fit,
)
from radixlm.plan.cost import Deployment
from radixlm.plan.weights import weights_bytes


def test_llama3_8b_weights_bf16_about_16gb(specs):
    assert weights_bytes(specs["Llama-3-8B"], "bf16") / 1e9 == pytest.approx(16.06, abs=0.01)


def test_quantized_weights_keep_embeddings_16bit(specs):
    m = specs["Llama-3-8B"]
    emb = (m.embedding_params() + m.lm_head_params() + m.norm_params()) * 2
    assert weights_bytes(m, "fp8") == pytest.approx(m.block_linear_params() * 1 + emb)
    # int4 weight-only with group-128 fp16 scale + zero: 0.5 + 4/128 bytes per weight
    assert weights_bytes(m, "int4") == pytest.approx(m.block_linear_params() * 0.53125 + emb)
    assert 5.5e9 < weights_bytes(m, "int4") < 6.0e9  # AWQ Llama-3-8B checkpoints: ~5.7 GB


def test_fp32_everything_four_bytes(specs):
    m = specs["smollm2"]
    assert weights_bytes(m, "fp32") == m.total_params() * 4


def test_llama3_70b_does_not_fit_one_h100(specs, h100):
    m = specs["Llama-3-70B"]
    assert not capacity(m, h100, tp=1).fits
    assert capacity(m, h100, tp=1).max_tokens == 0
    assert min_tp_that_fits(m, h100, context=8192) == 2
    assert gpus_for_weights(m, h100) == 2


def test_capacity_formula(specs, h100):
    m = specs["Llama-3-70B"]
    cap = capacity(m, h100, tp=4, context=8192, mem_fraction=0.9)
    budget = 80e9 * 0.9 - weights_bytes(m) / 4
    assert cap.kv_budget_bytes_per_gpu == pytest.approx(budget)
    assert cap.max_tokens == int(budget // (327_680 / 4))
    assert cap.max_users == cap.max_tokens // 8192


def test_kv_budget_override_and_pages(specs):
    m = specs["smollm2"]
    cap = capacity(m, None, kv_dtype="fp32", kv_budget_bytes=46_080 * 1000 + 5, page_size=16)
    assert cap.max_tokens == 1000 // 16 * 16


def test_replication_reduces_capacity_vs_ideal(specs, h100):
    rows = {r.tp: r for r in capacity_table(specs["Qwen2.5-7B"], h100)}
    assert rows[4].tokens_without_replication == rows[4].max_tokens
    assert rows[8].kv_replication == 2.0
    assert rows[8].tokens_without_replication == pytest.approx(2 * rows[8].max_tokens, abs=1)


def test_negative_budget_gives_zero():
    assert tokens_that_fit(-1.0, 100.0) == 0


@given(
    budget=st.integers(0, 10**12),
    per_token=st.integers(1, 10**7),
    page=st.sampled_from([1, 16, 64]),
)
def test_tokens_that_fit_is_tight(budget, per_token, page):
    tokens = tokens_that_fit(budget, per_token, page)
    assert tokens % page == 0
    assert tokens * per_token <= budget
    assert (tokens + page) * per_token > budget  # one more page would not fit


def test_budget_subtracts_reserve(h100):
    assert kv_budget_per_gpu(h100, 10e9, tp=2, mem_fraction=0.5, reserve_bytes=1e9) == (
        pytest.approx(40e9 - 5e9 - 1e9)
    )


def test_max_decode_batch_limits(specs, h100):
    dep = Deployment(specs["Llama-3-8B"], h100)
    b_mem, why = max_decode_batch(dep, avg_context=1536, seq_tokens=2048, tpot_slo_ms=None)
    assert why == "memory" and b_mem == capacity(dep.model, h100, context=2048).max_tokens // 2048
    b, why = max_decode_batch(dep, avg_context=1536, seq_tokens=2048, tpot_slo_ms=6.0)
    assert why == "tpot" and 0 < b < b_mem
    assert dep.decode(b, 1536).time_s * 1e3 <= 6.0 < dep.decode(b + 1, 1536).time_s * 1e3


def test_gguf_q4_1_bytes_equal_the_bundled_file(specs):
    """The bundled SmolLM2 GGUF stores its block linears in Q4_1, the token embedding
    (tied head) in Q8_0 and norms in F32: the planner's q4_1 bytes are its tensor bytes."""
    gguf = pytest.importorskip("gguf")
    from radixlm.runtime.executor.model_registry import resolve_model_path

    reader = gguf.GGUFReader(resolve_model_path("smollm2-135m"))
    file_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    assert weights_bytes(specs["smollm2"], "q4_1") == file_bytes
    # by hand: 20 bytes per 32 block weights, 34 per 32 embedding weights, 4 per norm weight
    m = specs["smollm2"]
    hand = m.block_linear_params() * 20 / 32 + m.embedding_params() * 34 / 32
    assert file_bytes == hand + m.norm_params() * 4
    assert (
        weights_bytes(m, "q8_0")
        == (m.block_linear_params() + m.embedding_params()) * 34 / 32 + m.norm_params() * 4
    )


def test_gguf_formats_compute_in_fp32():
    from radixlm.plan.dtypes import compute_precision, normalize, weight_bytes_per_param

    assert [compute_precision(d) for d in ("q4_1", "q8_0", "Q4-1")] == ["fp32"] * 3
    assert normalize("Q8_0") == "q8_0"
    assert weight_bytes_per_param("q4_1", group_size=128) == 0.625  # group fixed at 32
