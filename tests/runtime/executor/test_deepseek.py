"""DeepSeek-V2/V3 specifics beyond the shared family features (tests/runtime/
test_family_features.py): routing equals transformers' routers, the latent KV size of the
full DeepSeek-V3 config, Kimi-K2-style configs, and config fields the implementation does
not support failing at load by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from radixlm import Engine
from radixlm.errors import UnsupportedModelError
from radixlm.plan.kv import kv_bytes_per_token
from radixlm.plan.models import load_model
from radixlm.runtime.executor.layers.moe import route
from radixlm.runtime.executor.models.deepseek import (
    DeepseekV2ForCausalLM,
    DeepseekV3ForCausalLM,
    mla_kv_bytes_per_token,
)
from tests.runtime.conftest import hf_greedy
from tests.tiny_models import save_family_model, tiny_config

PROMPTS = [[5, 17, 300, 4000, 9], list(range(100, 140))]


@pytest.mark.parametrize("family", ["deepseek-v2", "deepseek-v3"])
def test_routing_equals_transformers_router(family):
    """Same experts (as sets) and weights as transformers' router on 64 random tokens,
    with the group limit, V3's correction bias and the routed scaling factor."""
    import importlib

    config = tiny_config(family)
    v = family[-2:]
    module = importlib.import_module(f"transformers.models.deepseek_{v}.modeling_deepseek_{v}")
    ref = getattr(module, f"Deepseek{v.upper()}TopkRouter")(config)
    torch.manual_seed(0)
    with torch.no_grad():
        ref.weight.normal_(0, 0.3)
        if hasattr(ref, "e_score_correction_bias"):
            ref.e_score_correction_bias.normal_(0, 0.3)
    x = torch.randn(64, config.hidden_size)
    _, want_w, want_ids = ref(x)
    lm = DeepseekV3ForCausalLM if family == "deepseek-v3" else DeepseekV2ForCausalLM
    opts = lm.moe_options(config)
    assert opts.num_groups == 4 and opts.topk_groups == 2
    bias = getattr(ref, "e_score_correction_bias", None)
    got_w, got_ids = route(F.linear(x, ref.weight), opts, bias)
    order_got, order_want = got_ids.argsort(-1), want_ids.argsort(-1)
    assert torch.equal(got_ids.gather(1, order_got), want_ids.gather(1, order_want))
    torch.testing.assert_close(got_w.gather(1, order_got), want_w.gather(1, order_want))


def test_full_deepseek_v3_latent_kv_is_70272_bytes_per_token_in_bf16():
    """61 layers * (512 latent + 64 RoPE key) * 2 bytes, as `radixlm plan kv` computes it
    for its DeepSeek-V3 preset."""
    from transformers import DeepseekV3Config

    full = DeepseekV3Config()
    assert mla_kv_bytes_per_token(full, torch.bfloat16) == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token(load_model("DeepSeek-V3"), "bf16") == 70_272


@pytest.fixture(scope="module")
def v3_model(tmp_path_factory, hf_dir):
    """(model dir, transformers model, greedy references of PROMPTS) of the tiny V3."""
    path = tmp_path_factory.mktemp("deepseek-v3")
    model = save_family_model("deepseek-v3", path, hf_dir)
    return path, model, hf_greedy(model, PROMPTS, 8, eos_token_id=None)


def _copy_with(src, dst, **fields):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def _greedy(n: int = 8) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def test_a_kimi_k2_style_config_runs_as_deepseek_v3(v3_model, tmp_path):
    """model_type kimi_k2 (remote code in the real checkpoint) with the V3 architecture and
    its routing fields: read by transformers' DeepseekV3Config, same output."""
    path, _, refs = v3_model
    kimi = _copy_with(
        path, tmp_path / "kimi", model_type="kimi_k2", scoring_func="sigmoid",
        topk_method="noaux_tc",
    )  # fmt: skip
    with Engine(kimi, max_total_tokens=512) as e:
        assert type(e.runner.config).__name__ == "DeepseekV3Config"
        outs = e.generate(input_ids=PROMPTS, sampling_params=_greedy())
    assert [o["output_ids"] for o in outs] == refs


def test_cpu_torch_path_matches_transformers(v3_model):
    """torch's GEMM (input-major projections) and the torch_native backend."""
    path, _, refs = v3_model
    kw = {"cpu_gemm": "torch", "attention_backend": "torch_native"}
    with Engine(str(path), max_total_tokens=512, page_size=16, **kw) as e:
        outs = e.generate(input_ids=PROMPTS, sampling_params=_greedy())
    assert [o["output_ids"] for o in outs] == refs


UNSUPPORTED = {
    "scoring_func": ({"scoring_func": "foo"}, "scoring_func='foo'"),
    "topk_method": ({"topk_method": "greedy"}, "topk_method='greedy'"),
    "quantization_config": (
        {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
        "quantization method 'fp8' is not supported",
    ),
    "hidden_act": ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    "moe_layer_freq": ({"moe_layer_freq": 2}, "moe_layer_freq=2"),
    "n_group": ({"n_group": 3}, "num_groups must divide num_experts=8, got 3"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_an_unsupported_field_fails_at_load_naming_it(case, v3_model, tmp_path):
    fields, message = UNSUPPORTED[case]
    bad = _copy_with(v3_model[0], tmp_path / "bad", **fields)
    with pytest.raises(UnsupportedModelError) as err:
        Engine(bad, max_total_tokens=256)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"topk_method": "noaux_tc"}, "topk_method='noaux_tc'"),
        ({"scoring_func": "sigmoid"}, "scoring_func='sigmoid'"),
        ({"norm_topk_prob": True}, "norm_topk_prob=True"),
        ({"mlp_bias": True}, "mlp_bias=True"),
    ],
)
def test_an_unsupported_v2_field_is_refused_naming_it(fields, message):
    config = tiny_config("deepseek-v2", **fields)
    with pytest.raises(UnsupportedModelError) as err:
        DeepseekV2ForCausalLM.check_config(config)
    assert message in str(err.value)
