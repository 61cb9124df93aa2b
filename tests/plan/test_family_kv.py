"""`radixlm plan kv` / `plan capacity` per model family, on the tiny configs of
`tests/tiny_models.py` saved with `save_pretrained` (explicit head_dim different from
hidden / heads, Gemma 3's sliding and global layers, MoE configs).

Two references: the attention modules of transformers' own model built from the config
(every layer's K and V heads times its head_dim), and radixlm's engine
(`get_server_info()["kv_bytes_per_token"]`, `max_total_tokens`).
"""

from __future__ import annotations

import json

import pytest
import torch

from radixlm.plan.cli import main as plan_main
from tests.tiny_models import TINY_FAMILIES, save_random_model, tiny_config

FAMILIES = sorted(TINY_FAMILIES)


def _plan(capsys, *argv: str) -> dict:
    assert plan_main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _plan_kv(capsys, model: str) -> float:
    return _plan(capsys, "kv", "--model", model, "--kv-dtype", "fp32", "--json")["bytes_per_token"]


def _transformers_kv_bytes(config) -> int:
    """fp32 cache bytes per token summed over the layers of transformers' model: K and V
    heads, or (multi-head latent attention) the latent and the RoPE key it caches."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    kv_heads = config.get_text_config().num_key_value_heads

    def per_layer(attn) -> int:
        if hasattr(attn, "kv_lora_rank"):
            return (attn.kv_lora_rank + attn.qk_rope_head_dim) * 4
        return 2 * kv_heads * attn.head_dim * 4

    return sum(per_layer(layer.self_attn) for layer in model.model.layers)


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_kv_equals_transformers_layout(family, tmp_path, capsys):
    config = tiny_config(family)
    config.save_pretrained(tmp_path)
    assert _plan_kv(capsys, str(tmp_path)) == _transformers_kv_bytes(config)


def test_gemma3_multimodal_config_with_default_text_fields(tmp_path, capsys):
    """A Gemma3ForConditionalGeneration config.json as published: its text_config omits
    the fields equal to Gemma3TextConfig's defaults (8 heads, 4 KV heads, head_dim 256)."""
    from transformers import AutoConfig

    text = {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "text_config": text}))
    full = AutoConfig.from_pretrained(tmp_path).get_text_config()
    want = full.num_hidden_layers * full.num_key_value_heads * full.head_dim * 2 * 4
    assert want == 34 * 4 * 256 * 2 * 4
    assert _plan_kv(capsys, str(tmp_path)) == want


@pytest.fixture(scope="module")
def smollm2_tokenizer_dir():
    from radixlm.errors import ModelNotFoundError
    from radixlm.runtime import local_hf_dir

    try:
        return local_hf_dir("smollm2-135m")
    except ModelNotFoundError as exc:
        pytest.skip(f"tokenizer files come from the bundled model: {exc}")


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_equals_engine(family, tmp_path, capsys, smollm2_tokenizer_dir):
    """KV bytes per token, and the capacity of the engine's KV budget and page size."""
    from radixlm import Engine

    config = tiny_config(family)
    save_random_model(config, tmp_path, smollm2_tokenizer_dir)
    kw = {"max_total_tokens": 96, "page_size": 8, "cpu_gemm": "torch"}
    with Engine(str(tmp_path), attention_backend="torch_native", **kw) as engine:
        info = engine.get_server_info()
    assert _plan_kv(capsys, str(tmp_path)) == info["kv_bytes_per_token"]
    budget, page = str(info["kv_budget_bytes"]), str(info["page_size"])
    argv = ["capacity", "--model", str(tmp_path), "--kv-dtype", "fp32", "--tp", "1", "--json"]
    row = _plan(capsys, *argv, "--kv-budget-bytes", budget, "--page-size", page)["rows"][0]
    assert row["kv_bytes_per_token_per_gpu"] == info["kv_bytes_per_token"]
    assert row["max_tokens"] == info["max_total_tokens"]


SPARSE_LAYOUTS = {  # (family, config overrides, MoE layers)
    "every-layer": ("qwen3-moe", {}, 2),
    "every-second": ("qwen3-moe", {"num_hidden_layers": 4, "decoder_sparse_step": 2}, 2),
    "mlp-only": ("qwen2-moe", {"num_hidden_layers": 4, "mlp_only_layers": [0, 3]}, 2),
    "both": (  # layers 1 and 3 by the step, 1 dense by the list
        "qwen2-moe",
        {"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [1]},
        1,
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_counts_every_parameter(family):
    """The planner's parameter count equals transformers' model, norms, q/k norms and
    shared-expert gates included."""
    from transformers import AutoModelForCausalLM

    from radixlm.plan.models import spec_from_config

    config = tiny_config(family)
    model = AutoModelForCausalLM.from_config(config)
    assert spec_from_config(config.to_dict()).total_params() == model.num_parameters()


@pytest.mark.parametrize("layout", sorted(SPARSE_LAYOUTS))
def test_plan_counts_the_sparse_layers(layout):
    from transformers import AutoModelForCausalLM

    from radixlm.plan.models import spec_from_config

    family, overrides, moe_layers = SPARSE_LAYOUTS[layout]
    config = tiny_config(family, **overrides)
    spec = spec_from_config(config.to_dict())
    assert spec.num_moe_layers == moe_layers
    assert spec.total_params() == AutoModelForCausalLM.from_config(config).num_parameters()
