"""A .gguf model's Q4_1 / Q8_0 blocks kept as quantized panels (`--weight-format gguf`):
the blocks read from the bundled file hold exactly the converted fp32 weights, and an engine
on them gives the fp32 engine's tokens and logprobs while holding a third of the bytes."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from radixlm import Engine
from radixlm.kernels.cpu import quant
from radixlm.runtime.executor import gguf_blocks
from radixlm.runtime.executor.layers.cpu_linear import GgufPanels, PackedLinear, QuantLinear
from radixlm.runtime.executor.model_registry import resolve_model_path
from tests.kernels.test_quant_gemm import random_blocks
from tests.runtime.conftest import MODEL, greedy


@pytest.fixture(scope="module")
def blocks(hf_dir):
    from transformers import AutoConfig

    return gguf_blocks.load_blocks(
        resolve_model_path(MODEL), hf_dir, AutoConfig.from_pretrained(hf_dir)
    )


def test_every_block_holds_the_converted_fp32_weight(blocks, hf_dir):
    """Q4_1 projections (q/k rows un-permuted), the Q8_0 embedding, the tied head."""
    weights = load_file(str(hf_dir / "model.safetensors"))
    assert len(blocks) == 30 * 7 + 2  # 7 projections a layer, embedding, tied head alias
    assert blocks["lm_head"] is blocks["model.embed_tokens"]
    for name, b in blocks.items():
        want = weights.get(f"{name}.weight", weights["model.embed_tokens.weight"])
        assert b.fmt == (quant.Q8_0 if name in ("lm_head", "model.embed_tokens") else quant.Q4_1)
        assert torch.equal(quant.dequantize_blocks(b.data, b.fmt, b.k), want), name
    assert (hf_dir / gguf_blocks.BLOCKS_FILE).is_file()


def test_unpermute_rows_inverts_llama_cpps_permutation():
    heads, half = 3, 4
    hf = torch.arange(heads * 2 * half * 5, dtype=torch.uint8).reshape(heads * 2 * half, 5)
    # llama.cpp's converter: rows [heads, 2, half] of HF order become [heads, half, 2]
    permuted = hf.reshape(heads, 2, half, 5).transpose(1, 2).reshape(hf.shape)
    assert torch.equal(gguf_blocks._unpermute_rows(permuted, heads), hf)


def test_blocks_that_differ_from_the_weights_stay_fp32(cpu_kernels, caplog):
    raw = random_blocks(32, 64, quant.Q4_1)
    lin = nn.Linear(64, 32, bias=True)
    lin.weight.data = quant.dequantize_blocks(raw, quant.Q4_1, 64)
    source = GgufPanels({"a": gguf_blocks.RawBlocks(quant.Q4_1, raw, 64)})
    kept = source.linear(["a"], [lin], cpu_kernels)
    assert isinstance(kept, QuantLinear) and source.quantized == 1
    x = torch.randn(3, 64)
    assert torch.equal(kept(x), PackedLinear(lin, cpu_kernels)(x))
    lin.weight.data[5, 7] += 1e-3
    with caplog.at_level(logging.WARNING):
        assert isinstance(source.linear(["a"], [lin], cpu_kernels), PackedLinear)
    assert "differ" in caplog.text
    assert isinstance(source.linear(["missing"], [lin], cpu_kernels), PackedLinear)


@pytest.fixture(scope="module")
def engines():
    kw = {"max_total_tokens": 6000, "chunked_prefill_size": 512}
    with (
        Engine(MODEL, weight_format="gguf", **kw) as q,
        Engine(MODEL, weight_format="fp32", **kw) as f,
    ):
        yield q, f


def test_gguf_engine_equals_fp32_engine(engines, prompts):
    """Same tokens and the same logprobs (bit for bit) for a batch with a 1,500-token
    prompt prefilled in chunks (the blocked GEMM path) and short ones (row tiles)."""
    params = greedy()
    kw = {"return_logprob": True, "top_logprobs_num": 2}
    got, want = (e.generate(input_ids=prompts, sampling_params=params, **kw) for e in engines)
    for g, w in zip(got, want):
        assert g["output_ids"] == w["output_ids"]
        assert g["meta_info"]["output_token_logprobs"] == w["meta_info"]["output_token_logprobs"]
        assert g["meta_info"]["output_top_logprobs"] == w["meta_info"]["output_top_logprobs"]


def test_server_info_counts_the_quantized_bytes(engines):
    q, f = (e.get_server_info() for e in engines)
    assert q["resolved"]["quantized_weights"] == 30 * 4 + 1  # fused qkv, o, gate_up, down; head
    assert f["resolved"]["quantized_weights"] == 0
    assert (q["resolved"]["weight_format"], f["resolved"]["weight_format"]) == ("gguf", "fp32")
    assert f["weights_bytes"] == 134_515_008 * 4  # every parameter fp32, tied head once
    # Q4_1 panels: 320 bytes per 16 x 32 weights; the embedding stays fp32 (lookups).
    layer = (960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536) // 512 * 320
    norms = (30 * 2 + 1) * 576 * 4
    assert q["weights_bytes"] == 30 * layer + 49152 * 576 * 4 + norms


def test_gguf_needs_the_cpu_kernels_and_a_gguf_model():
    with pytest.raises(ValueError, match="--weight-format gguf"):
        Engine(MODEL, weight_format="gguf", cpu_gemm="torch", max_total_tokens=256)


def test_block_types_the_kernels_do_not_read_stay_fp32_with_a_warning(tmp_path, caplog):
    """A Q4_K_M file's Q4_K projections are left to the fp32 conversion and named; its
    Q8_0 ones are kept as blocks."""
    from types import SimpleNamespace

    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    path = tmp_path / "m.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    q4k = np.zeros((2, 144), dtype=np.uint8)  # 2 rows of one 256-value Q4_K block
    writer.add_tensor("blk.0.attn_q.weight", q4k, raw_dtype=GGMLQuantizationType.Q4_K)
    q8 = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)  # 2 rows of one Q8_0 block
    writer.add_tensor("blk.0.attn_v.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = SimpleNamespace(num_attention_heads=1, num_key_value_heads=1)
    with caplog.at_level(logging.WARNING):
        blocks = gguf_blocks.read_blocks(path, config)
    assert list(blocks) == ["model.layers.0.self_attn.v_proj"]
    v = blocks["model.layers.0.self_attn.v_proj"]
    assert (v.fmt, v.k) == (quant.Q8_0, 32) and torch.equal(v.data, torch.from_numpy(q8))
    assert "Q4_K x1" in caplog.text
