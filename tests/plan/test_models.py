"""Parameter counts and layouts of the presets against their published figures."""

from __future__ import annotations

import json

import pytest

from radixlm.errors import ModelNotFoundError
from radixlm.plan.models import load_model, spec_from_config

# Published parameter counts (model cards / papers), in billions.
PUBLISHED = {
    "Llama-3-8B": 8.03,
    "Llama-3-70B": 70.55,
    "Qwen2.5-7B": 7.61,
    "Mixtral-8x7B": 46.7,
    "DeepSeek-V3": 671.0,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_params_match_published(specs, name):
    assert specs[name].total_params() / 1e9 == pytest.approx(PUBLISHED[name], rel=0.005)


def test_active_params_of_moe_models(specs):
    assert specs["Mixtral-8x7B"].active_params() / 1e9 == pytest.approx(12.9, rel=0.01)
    assert specs["DeepSeek-V3"].active_params() / 1e9 == pytest.approx(37.0, rel=0.02)
    assert specs["Llama-3-8B"].active_params() == specs["Llama-3-8B"].total_params()


def test_smollm2_params(specs):
    # DESIGN.md: 134.5M parameters once dequantized.
    assert specs["smollm2"].total_params() / 1e6 == pytest.approx(134.5, abs=0.1)


def test_attention_kinds(specs):
    assert specs["Llama-3-70B"].attention == "gqa"
    assert specs["DeepSeek-V3"].attention == "mla"
    mha = spec_from_config({**_llama_like(), "num_key_value_heads": 32})
    mqa = spec_from_config({**_llama_like(), "num_key_value_heads": 1})
    assert (mha.attention, mqa.attention) == ("mha", "mqa")


def _llama_like() -> dict:
    return {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "intermediate_size": 11008,
    }


def test_config_defaults():
    spec = spec_from_config(_llama_like())
    assert spec.head_dim == 128 and spec.num_kv_heads == 32 and not spec.is_moe


def test_qwen2_has_qkv_bias(specs):
    assert specs["Qwen2.5-7B"].qkv_bias and not specs["Llama-3-8B"].qkv_bias


def test_load_preset_case_insensitive():
    assert load_model("llama-3-70b").name == "Llama-3-70B"


def test_load_local_config_json(tmp_path):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**_llama_like(), "num_key_value_heads": 8}))
    assert load_model(str(path)).num_kv_heads == 8
    assert load_model(str(path.parent)).num_layers == 2


def test_unknown_model_lists_presets():
    with pytest.raises(ModelNotFoundError, match="Llama-3-8B"):
        load_model("no-such-model-xyz")


def test_attention_flops_per_cached_token(specs):
    # Llama-3-8B: 4 x 32 heads x 128 x 32 layers
    assert specs["Llama-3-8B"].attn_flops_per_context_token() == 4 * 32 * 128 * 32
    ds = specs["DeepSeek-V3"]
    # absorbed MLA decode: 2 (512 + 64) + 2 x 512 per head; expanded prefill: 2 x 192 + 2 x 128
    assert ds.attn_flops_per_context_token() == 61 * 128 * (2 * 576 + 2 * 512)
    assert ds.attn_flops_per_context_token(prefill=True) == 61 * 128 * (2 * 192 + 2 * 128)
