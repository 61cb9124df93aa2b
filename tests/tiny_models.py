"""Random-initialised small models saved as Hugging Face directories, for tests that need
a model architecture other than the bundled one (or a cheaper one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def save_random_model(config, path: Path, hf_dir: Path):
    """Build `config`'s causal LM with seeded N(0, 0.3) weights (larger than the default
    init, so logits are not flat and greedy ties are rare), save it with the bundled
    model's tokenizer files under `path`, and return the fp32 transformers model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, path / name)
    return model


#: Shapes every tiny family config shares: the bundled tokenizer's vocabulary, GQA with
#: two query heads per KV head, a few layers.
TINY_SHAPE = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=2,
    bos_token_id=1,
)

#: Tokens a tiny sliding-window layer sees: small enough that the test prompts cross it.
TINY_WINDOW = 8


def tiny_config(family: str):
    """A tiny transformers config of `family` (one of `TINY_FAMILIES`), built with the
    family's own config class."""
    return TINY_FAMILIES[family]()


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig(**TINY_SHAPE, tie_word_embeddings=True)


def _qwen2():
    from transformers import Qwen2Config

    return Qwen2Config(**TINY_SHAPE, tie_word_embeddings=False)


def _mistral():
    from transformers import MistralConfig

    return MistralConfig(**TINY_SHAPE, tie_word_embeddings=False, sliding_window=TINY_WINDOW)


def _mixtral():
    from transformers import MixtralConfig

    shape = {**TINY_SHAPE, "intermediate_size": 48}
    return MixtralConfig(**shape, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)


def _qwen2_moe():
    from transformers import Qwen2MoeConfig

    # Layer 0 keeps a dense MLP (mlp_only_layers), layers 1-2 hold experts and the shared one.
    return Qwen2MoeConfig(
        **{**TINY_SHAPE, "num_hidden_layers": 3},
        tie_word_embeddings=False,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        mlp_only_layers=[0],
        norm_topk_prob=False,
    )


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **TINY_SHAPE,
        tie_word_embeddings=False,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    )


def _qwen3():
    from transformers import Qwen3Config

    return Qwen3Config(**TINY_SHAPE, head_dim=32, tie_word_embeddings=False)


def _gemma3():
    from transformers import Gemma3TextConfig

    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
    }
    return Gemma3TextConfig(
        **{**TINY_SHAPE, "num_hidden_layers": 3},
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=TINY_WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters=rope,
        pad_token_id=0,
    )


def _phi3():
    from transformers import Phi3Config

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}
    return Phi3Config(
        **TINY_SHAPE, tie_word_embeddings=True, sliding_window=TINY_WINDOW, rope_parameters=rope
    )


def perturb_gemma_norms(model) -> None:
    """Draw a Gemma model's norm weights (in place): with all-zero unit-offset norms the
    attention and MLP outputs are small next to the sqrt(hidden)-scaled embedding and a
    tied random model repeats its input token."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(2.0 if ".post_" in name else 0.0, 0.5)


def save_family_model(family: str, path: Path, hf_dir: Path):
    """`save_random_model` of `tiny_config(family)` (Gemma's norms drawn too); returns the
    fp32 transformers model."""
    model = save_random_model(tiny_config(family), path, hf_dir)
    if family.startswith("gemma"):
        perturb_gemma_norms(model)
        model.save_pretrained(path)
    return model


#: family name -> builder of its tiny config.
TINY_FAMILIES = {
    "qwen3": _qwen3,
    "gemma3": _gemma3,
    "phi3": _phi3,
    "llama": _llama,
    "qwen2": _qwen2,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2-moe": _qwen2_moe,
    "qwen3-moe": _qwen3_moe,
}
