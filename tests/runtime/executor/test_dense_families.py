"""Qwen3, Gemma 3 (text) and Phi-3 on tiny random checkpoints saved with save_pretrained:
greedy output equal to transformers token for token on both CPU paths (single requests
and a batch; Gemma 3's local layers and Phi-3 with a window shorter than the prompts);
Gemma 3's soft-capped logprobs equal transformers'; KV bytes per token from each family's
own head_dim; and the errors a bad checkpoint or an unsupported config raises at Engine
start, naming the tensor or the field."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm import Engine
from radixlm.errors import UnsupportedModelError, WeightsMismatchError
from tests.runtime.conftest import hf_greedy
from tests.runtime.executor.test_model_families import CPU_PATHS
from tests.tiny_models import perturb_gemma_norms, save_random_model, tiny_config

#: Longer than every prompt and output below: the window never masks anything.
WIDE = 1000
#: Shorter than all but the first prompt: the window masks keys the full layers see.
NARROW = 8
PROMPTS = [[5, 17, 300, 4000, 9], [77] * 30 + [123, 456], list(range(100, 200))]
NEW = 12


def _tiny(kind: str):
    """The transformers config of `kind`: "<family>[-window]" (-window: NARROW), three
    layers."""
    family, _, windowed = kind.partition("-")
    window = NARROW if windowed else WIDE
    if family == "qwen3":  # head_dim 32 != hidden / heads: q_proj is wider than hidden
        if windowed:  # layer 0 full, layers 1-2 sliding
            return tiny_config(
                "qwen3",
                num_hidden_layers=3,
                use_sliding_window=True,
                max_window_layers=1,
                sliding_window=NARROW,
            )
        return tiny_config("qwen3", num_hidden_layers=3)
    if family == "gemma3":
        return tiny_config("gemma3", sliding_window=window, final_logit_softcapping=3.0)
    if family == "phi3":  # Phi-4-mini style: tied, 3/4 of each head rotated
        window = NARROW if windowed else None  # None: the C decode stack must step aside
        return tiny_config("phi3", num_hidden_layers=3, sliding_window=window)
    if family == "phi3full":  # Phi-3-mini style: untied, whole heads rotated, no window
        return tiny_config(
            "phi3",
            num_hidden_layers=3,
            tie_word_embeddings=False,
            sliding_window=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    raise ValueError(kind)


def _save(kind: str, path, hf_dir):
    """Save `kind`'s tiny model under `path`; returns the fp32 transformers model. Gemma 3's
    norm weights are drawn too (attention and MLP outputs larger than the sqrt(hidden)-
    scaled embedding, else a tied random model repeats its input token) and saved again."""
    model = save_random_model(_tiny(kind), path, hf_dir)
    if kind.startswith("gemma3"):
        perturb_gemma_norms(model)
        model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory, hf_dir):
    """kind -> (checkpoint dir, transformers model, greedy references of PROMPTS), each
    saved once per module."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            path = tmp_path_factory.mktemp(kind)
            model = _save(kind, path, hf_dir)
            cache[kind] = path, model, hf_greedy(model, PROMPTS, NEW, eos_token_id=None)
        return cache[kind]

    return get


GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
KINDS = ["qwen3", "qwen3-window", "gemma3", "gemma3-window", "phi3", "phi3-window", "phi3full"]


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
@pytest.mark.parametrize("kind", KINDS)
def test_family_matches_transformers(kind, path, saved):
    ckpt, model, refs = saved(kind)
    with Engine(str(ckpt), max_total_tokens=1024, page_size=4, **CPU_PATHS[path]) as engine:
        singles = [
            engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in PROMPTS
        ]
        batch = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        # K and V of every layer at the family's own head_dim (Qwen3/Gemma 3: 32, not
        # hidden / heads), fp32.
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_bytes = cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2 * 4
        assert engine.get_server_info()["kv_bytes_per_token"] == kv_bytes
    assert singles == refs
    assert [o["output_ids"] for o in batch] == refs


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3"])
def test_narrow_window_changes_the_reference(family, saved):
    """The windowed kinds test the window: transformers' output differs without it."""
    assert saved(family)[2] != saved(f"{family}-window")[2]


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
def test_gemma3_logprobs_are_soft_capped(path, saved):
    """Output logprobs equal log_softmax of transformers' soft-capped logits (cap 3.0:
    without it they would differ by far more than the tolerance)."""
    ckpt, model, refs = saved("gemma3")
    prompt = PROMPTS[2]
    with Engine(str(ckpt), max_total_tokens=1024, page_size=4, **CPU_PATHS[path]) as engine:
        out = engine.generate(input_ids=prompt, sampling_params=GREEDY, return_logprob=True)
    got = torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])
    ids = torch.tensor([prompt + refs[2]])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(refs[2])[:, None])[:, 0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert logits.abs().max() <= 3.0


def _edit_weights(ckpt, edit) -> None:
    """Apply `edit` (state dict -> None) to the checkpoint's single safetensors file."""
    (f,) = ckpt.glob("*.safetensors")
    state = load_file(f)
    edit(state)
    save_file(state, f, metadata={"format": "pt"})


BAD_WEIGHTS = {
    "missing": (
        "qwen3",
        lambda s: s.pop("model.layers.1.self_attn.k_norm.weight"),
        "missing tensors ['model.layers.1.self_attn.k_norm.weight']",
    ),
    "unexpected": (
        "gemma3",
        lambda s: s.update({"model.layers.0.self_attn.sinks": torch.zeros(4)}),
        "unexpected tensors ['model.layers.0.self_attn.sinks']",
    ),
    "wrong-shape": (
        "gemma3",
        lambda s: s.update({"model.layers.2.pre_feedforward_layernorm.weight": torch.zeros(32)}),
        "model.layers.2.pre_feedforward_layernorm.weight: checkpoint (32,), config expects (64,)",
    ),
    "wrong-shape-fused-qkv": (
        "phi3",
        lambda s: s.update(
            {"model.layers.1.self_attn.qkv_proj.weight": torch.zeros(64 * 3, 64)}
        ),  # MHA-sized: the config has 2 KV heads of 4
        "model.layers.1.self_attn.qkv_proj.weight: checkpoint (192, 64), config expects (128, 64)",
    ),
    "missing-fused": (  # named as the checkpoint names it, not by its split parts
        "phi3full",
        lambda s: s.pop("model.layers.0.mlp.gate_up_proj.weight"),
        "missing tensors ['model.layers.0.mlp.gate_up_proj.weight']",
    ),
    "split-beside-fused": (  # one would silently replace the other
        "phi3full",
        lambda s: s.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 64)}),
        "checkpoint holds both model.layers.0.mlp.up_proj.weight and "
        "model.layers.0.mlp.gate_up_proj.weight",
    ),
    "wrong-shape-fused-gate-up": (
        "phi3full",
        lambda s: s.update({"model.layers.0.mlp.gate_up_proj.weight": torch.zeros(128, 64)}),
        "model.layers.0.mlp.gate_up_proj.weight: checkpoint (128, 64), config expects (256, 64)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
def test_bad_checkpoint_names_the_tensor(case, saved, tmp_path):
    kind, edit, message = BAD_WEIGHTS[case]
    ckpt = tmp_path / "model"
    shutil.copytree(saved(kind)[0], ckpt)
    _edit_weights(ckpt, edit)
    with pytest.raises(WeightsMismatchError) as err:
        Engine(str(ckpt), max_total_tokens=256, page_size=4, **CPU_PATHS["torch"])
    assert message in str(err.value)


#: 6 factors: one per rotated pair of Phi-3's 12 rotated dims.
_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.75,
    "short_factor": [1.0] * 6,
    "long_factor": [2.0] * 6,
    "original_max_position_embeddings": 128,
}

BAD_CONFIGS = {
    "qwen3-dynamic-rope": (
        "qwen3",
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
        UnsupportedModelError,
        "rope_parameters.rope_type 'dynamic' is not supported",
    ),
    "phi3-longrope": (
        "phi3",
        {"rope_parameters": _LONGROPE},
        UnsupportedModelError,
        "rope_parameters.rope_type 'longrope' is not supported",
    ),
    "gemma3-attn-softcap": (
        "gemma3",
        {"attn_logit_softcapping": 50.0},
        UnsupportedModelError,
        "config field attn_logit_softcapping=50.0 is not supported",
    ),
    "gemma3-bidirectional": (
        "gemma3",
        {"use_bidirectional_attention": True},
        UnsupportedModelError,
        "config field use_bidirectional_attention=True is not supported",
    ),
    "unknown-architecture": (
        "qwen3",
        {"architectures": ["Qwen9ForCausalLM"]},
        UnsupportedModelError,
        "supported: [",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_unsupported_config_names_the_field(case, saved, tmp_path):
    kind, fields, error, message = BAD_CONFIGS[case]
    ckpt = tmp_path / "model"
    shutil.copytree(saved(kind)[0], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, **fields}))
    with pytest.raises(error) as err:
        Engine(str(ckpt), max_total_tokens=256, page_size=4, **CPU_PATHS["torch"])
    assert message in str(err.value)
    if case == "unknown-architecture":
        for arch in ("Gemma3ForCausalLM", "Phi3ForCausalLM", "Qwen3ForCausalLM"):
            assert repr(arch) in str(err.value)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_unit_offset_norm_equals_gemma3_rmsnorm(dtype):
    """Gemma's (1 + w) scale is formed and applied in fp32 before the cast, bit for bit
    as transformers' Gemma3RMSNorm (rounding 1 + w to a half type would not be)."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    from radixlm.runtime.executor.layers.blocks import RMSNorm

    torch.manual_seed(0)
    w = torch.randn(64).to(dtype)
    x = (torch.randn(5, 64) * 3).to(dtype)
    ref = Gemma3RMSNorm(64, eps=1e-6).to(dtype)
    ours = RMSNorm(64, 1e-6, unit_offset=True).to(dtype)
    with torch.no_grad():
        ref.weight.copy_(w)
        ours.weight.copy_(w)
    ours.process_weights_after_loading()
    with torch.inference_mode():
        got, want = ours(x), ref(x)
    assert got.dtype == dtype
    assert torch.equal(got, want)
