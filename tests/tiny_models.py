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
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
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


#: The multi-head latent attention shape of the tiny DeepSeek configs: every head its own
#: KV head in transformers' expansion, a latent of 32 and a RoPE key of 16, value heads (24)
#: narrower than query/key heads (16 + 16); three layers, the first dense.
TINY_MLA = dict(
    num_hidden_layers=3,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=24,
    moe_intermediate_size=32,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    tie_word_embeddings=False,
)


#: family -> (transformers config class, its settings beyond `TINY_SHAPE`): explicit
#: head_dim 32 != hidden / heads where the family has the field; windows that the test
#: prompts cross; MoE with dense and sparse layers.
TINY_FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": True}),
    "qwen2": (  # layer 0 full, layer 1 sliding (use_sliding_window from max_window_layers)
        "Qwen2Config",
        {
            "tie_word_embeddings": False,
            "use_sliding_window": True,
            "max_window_layers": 1,
            "sliding_window": TINY_WINDOW,
        },
    ),
    "mistral": ("MistralConfig", {"tie_word_embeddings": False, "sliding_window": TINY_WINDOW}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": False}),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "num_hidden_layers": 3,
            "head_dim": 32,
            "query_pre_attn_scalar": 24,
            "sliding_window": TINY_WINDOW,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            },
            "pad_token_id": 0,
        },
    ),
    "phi3": (  # Phi-4-mini style: tied, 3/4 of each head rotated
        "Phi3Config",
        {
            "tie_word_embeddings": True,
            "sliding_window": TINY_WINDOW,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
            },
        },
    ),
    "mixtral": (
        "MixtralConfig",
        {"intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "qwen2-moe": (  # layer 0 keeps a dense MLP, layers 1-2 hold experts and the shared one
        "Qwen2MoeConfig",
        {
            "num_hidden_layers": 3,
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "mlp_only_layers": [0],
            "norm_topk_prob": False,
            "use_sliding_window": True,
            "max_window_layers": 1,
            "sliding_window": TINY_WINDOW,
        },
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {
            "tie_word_embeddings": False,
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "sliding_window": TINY_WINDOW,  # every layer: Qwen3-MoE has no layer_types
        },
    ),
    "deepseek-v2": (  # MLA without q LoRA; layer 0 dense, then group-limited softmax MoE
        "DeepseekV2Config",
        {
            **TINY_MLA,
            "q_lora_rank": None,
            "n_routed_experts": 8,
            "n_shared_experts": 2,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 1.5,
        },
    ),
    "deepseek-v3": (  # MLA with q LoRA, YaRN; layer 0 dense, then sigmoid grouped MoE
        "DeepseekV3Config",
        {
            **TINY_MLA,
            "q_lora_rank": 48,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "rope_interleave": True,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    ),
}


def tiny_config(family: str, **overrides):
    """A tiny transformers config of `family` (a `TINY_FAMILIES` key), built with the
    family's own config class; `overrides` replace any setting."""
    import transformers

    cls_name, settings = TINY_FAMILIES[family]
    return getattr(transformers, cls_name)(**{**TINY_SHAPE, **settings, **overrides})


def perturb_gemma_norms(model) -> None:
    """Draw a Gemma model's norm weights (in place): with all-zero unit-offset norms the
    attention and MLP outputs are small next to the sqrt(hidden)-scaled embedding and a
    tied random model repeats its input token."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(2.0 if ".post_" in name else 0.0, 0.5)


def draw_correction_biases(model) -> None:
    """Draw a DeepSeek-V3 model's router correction biases (in place; zero at init), so
    that they change which experts are chosen."""
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                p.normal_(0.0, 0.3)


def save_family_model(family: str, path: Path, hf_dir: Path):
    """`save_random_model` of `tiny_config(family)` (Gemma's norms and DeepSeek-V3's
    correction biases drawn too); returns the fp32 transformers model."""
    model = save_random_model(tiny_config(family), path, hf_dir)
    if family.startswith("gemma"):
        perturb_gemma_norms(model)
        model.save_pretrained(path)
    if family == "deepseek-v3":
        draw_correction_biases(model)
        model.save_pretrained(path)
    return model


def save_random_eagle_head(target, base_model: str, out: Path, intermediate: int) -> str:
    """Save a seeded random EAGLE head shaped like the radixlm model `target` (its hidden
    size and layer-0 attention) under `out`; returns the path as a string. Acceptance is
    irrelevant for the exactness tests that use it."""
    from safetensors.torch import save_file

    from radixlm.runtime.speculative.eagle_head import WEIGHTS_NAME, EagleConfig, EagleHead

    attn = target.model.layers[0].self_attn
    cfg = EagleConfig(base_model, target.config.hidden_size, intermediate, attn.num_heads,
                      attn.num_kv_heads, attn.head_dim, target.config.rms_norm_eps)  # fmt: skip
    torch.manual_seed(0)
    head = EagleHead(cfg, target.config, target.model.embed_tokens, target.lm_head)
    save_file(head.head_state_dict(), Path(out) / WEIGHTS_NAME)
    cfg.save(Path(out))
    return str(out)
