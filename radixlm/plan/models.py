"""Model shapes for the planner: built-in presets, config reading, parameter counts.

A `ModelSpec` holds only the numbers the planner's formulas need. It is built from a
Hugging Face style config dictionary (the keys of a model's ``config.json``), so the
presets below are the published config values of each model, and a local config.json or
a radixlm model alias (through `radixlm.runtime.load_hf_config`) go through
the same reader.

Sources of the preset numbers (the public ``config.json`` of each checkpoint):
  * Llama-3-8B / Llama-3-70B: meta-llama/Meta-Llama-3-{8B,70B}; Dubey et al. 2024, "The
    Llama 3 Herd of Models", table 3 (layers, dims, heads, 8 KV heads, vocab 128,256).
  * Qwen2.5-7B: Qwen/Qwen2.5-7B-Instruct (28 layers, 28 query / 4 KV heads, QKV bias).
  * Mixtral-8x7B: mistralai/Mixtral-8x7B-v0.1; Jiang et al. 2024, "Mixtral of Experts"
    (8 experts, top-2, 46.7B total / 12.9B active parameters).
  * DeepSeek-V3: deepseek-ai/DeepSeek-V3; DeepSeek-AI 2024, "DeepSeek-V3 Technical Report"
    (MLA with d_c = 512, d_h^R = 64; 256 routed + 1 shared expert, top-8; first 3 layers
    dense; 671B total / 37B active parameters, excluding the 14B multi-token-prediction
    module, which this planner leaves out).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.errors import ModelNotFoundError

PRESETS: dict[str, dict[str, Any]] = {
    "Llama-3-8B": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    "Llama-3-70B": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-7B": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    "Mixtral-8x7B": {
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "DeepSeek-V3": {
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "max_position_embeddings": 163840,
        "tie_word_embeddings": False,
    },
}

# Architectures whose q/k/v projections carry a bias (Qwen2 family).
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe"}
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3_text", "gemma3"}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, in the units the formulas use.

    Attention layout (`attention`): ``mha`` (num_kv_heads == num_heads), ``gqa``
    (1 < num_kv_heads < num_heads), ``mqa`` (one KV head) or ``mla`` (DeepSeek-V2/V3
    multi-head latent attention: the cache holds a compressed latent of `kv_lora_rank`
    values plus one decoupled RoPE key of `qk_rope_head_dim` values per token and layer).
    MoE fields are zero for dense models.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    max_context: int
    qkv_bias: bool = False
    # MLA (zero when absent)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE (zero when dense)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    #: Qwen2-MoE scales its shared expert by sigmoid(x @ shared_expert_gate) [1, hidden].
    shared_expert_gate: bool = False
    # Norms: per-layer RMSNorms over hidden (Gemma 3 has four), per-head q/k norms.
    norms_per_layer: int = 2
    qk_norm: bool = False
    #: The weight format of a quantized checkpoint (`checkpoint_dtype`), else None.
    checkpoint_dtype: str | None = None

    @property
    def attention(self) -> str:
        if self.kv_lora_rank:
            return "mla"
        if self.num_kv_heads == self.num_heads:
            return "mha"
        return "mqa" if self.num_kv_heads == 1 else "gqa"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    # ---- parameter counts (elements, not bytes) ----
    def attention_params_per_layer(self) -> int:
        """Projection weights (+ biases, + MLA norms) of one attention block."""
        h, n = self.hidden_size, self.num_heads
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * qk
            else:
                q = h * n * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + n * self.v_head_dim * h
        q_out, kv_out = n * self.head_dim, self.num_kv_heads * self.head_dim
        params = h * q_out + 2 * h * kv_out + q_out * h
        if self.qkv_bias:
            params += q_out + 2 * kv_out
        return params

    def dense_mlp_params(self) -> int:
        """SwiGLU MLP: gate, up (hidden x inter) and down (inter x hidden)."""
        return 3 * self.hidden_size * self.intermediate_size

    def expert_params(self) -> int:
        """One routed expert (a SwiGLU MLP of width `moe_intermediate_size`)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def shared_expert_params(self) -> int:
        return 3 * self.hidden_size * self.shared_expert_intermediate_size

    def router_params(self) -> int:
        """The router [E, hidden] (and a shared-expert gate [1, hidden]) of one MoE layer."""
        return self.hidden_size * (self.num_experts + self.shared_expert_gate)

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        """Output projection; zero when tied to the input embedding."""
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def norm_params(self) -> int:
        """RMSNorm weights: each layer's, the final one, and q/k norms of head_dim."""
        qk = 2 * self.head_dim * self.num_layers if self.qk_norm else 0
        return (self.norms_per_layer * self.num_layers + 1) * self.hidden_size + qk

    def block_linear_params(self, active_only: bool = False) -> int:
        """Weights of every linear layer inside the transformer blocks (quantizable part).

        With `active_only`, each MoE layer counts `experts_per_token` routed experts (what
        one token multiplies with) instead of all of them.
        """
        attn = self.num_layers * self.attention_params_per_layer()
        dense_layers = self.num_dense_layers if self.is_moe else self.num_layers
        mlp = dense_layers * self.dense_mlp_params()
        if self.is_moe:
            routed = self.experts_per_token if active_only else self.num_experts
            per_layer = (
                routed * self.expert_params() + self.shared_expert_params() + self.router_params()
            )
            mlp += self.num_moe_layers * per_layer
        return attn + mlp

    def total_params(self) -> int:
        """All parameters: embeddings, blocks, norms and the (untied) LM head."""
        return (
            self.embedding_params()
            + self.lm_head_params()
            + self.norm_params()
            + self.block_linear_params()
        )

    def active_params(self) -> int:
        """Parameters one token touches (MoE: only its top-k experts); = total if dense."""
        return (
            self.embedding_params()
            + self.lm_head_params()
            + self.norm_params()
            + self.block_linear_params(active_only=True)
        )

    def matmul_params_per_token(self) -> int:
        """Parameters one token multiplies with: active block linears + LM head.

        The input embedding is a row lookup, not a matmul, so it costs no FLOPs; with
        tied embeddings the same matrix is multiplied as the LM head.
        """
        head = self.vocab_size * self.hidden_size
        return self.block_linear_params(active_only=True) + head

    def attn_flops_per_context_token(self, prefill: bool = False) -> int:
        """FLOPs one query token spends per cached token, summed over layers.

        Standard attention: scores q.k (2 * head_dim per head) and the weighted sum of v
        (2 * head_dim per head): 4 * num_heads * head_dim per layer. MLA (DeepSeek-V2,
        section 2.1.3) decodes in the absorbed form, scoring against the latent plus the
        RoPE key (kv_lora_rank + qk_rope_head_dim) and summing latents (kv_lora_rank) per
        head; prefill (`prefill=True`) runs on expanded per-head keys (qk_nope +
        qk_rope) and values (v_head_dim), as SGLang and vLLM do (the up-projection of
        cached latents is not counted).
        """
        if self.attention == "mla":
            if prefill:
                per_head = 2 * (self.qk_nope_head_dim + self.qk_rope_head_dim) + 2 * self.v_head_dim
            else:
                per_head = 2 * (self.kv_lora_rank + self.qk_rope_head_dim) + 2 * self.kv_lora_rank
            return self.num_layers * self.num_heads * per_head
        return self.num_layers * 4 * self.num_heads * self.head_dim


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return default


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decoder's config of a multimodal config (Gemma 3's Gemma3ForConditionalGeneration
    nests it under `text_config`), completed with its class defaults.

    transformers writes a nested config as its difference from the nested class's
    defaults, so a real ``config.json`` may omit fields the planner reads (Gemma 3's
    text_config leaves out num_attention_heads, num_key_value_heads and head_dim, which
    differ from the generic defaults below). The class of its `model_type` fills them
    when transformers is installed; otherwise the dictionary is read as it is.
    """
    text = cfg["text_config"]
    try:
        from transformers import AutoConfig

        return {**AutoConfig.for_model(text["model_type"]).to_dict(), **text}
    except (ImportError, KeyError, ValueError):
        return text


def checkpoint_dtype(cfg: Mapping[str, Any]) -> str | None:
    """The planner's weight format of a quantized checkpoint, read from config.json's
    `quantization_config` (what radixlm loads: compressed-tensors int4 / int8 / fp8
    weights, GPTQ and AWQ int4), or None for an unquantized or unrecognised one."""
    q = cfg.get("quantization_config") or {}
    method = q.get("quant_method")
    if method in ("gptq", "awq"):
        return "int4" if q.get("bits", q.get("w_bit")) == 4 else None
    if method == "compressed-tensors":
        groups = list((q.get("config_groups") or {}).values())
        w = (groups[0].get("weights") or {}) if groups else {}
        kind = {(4, "int"): "int4", (8, "int"): "int8", (8, "float"): "fp8"}
        return kind.get((w.get("num_bits"), w.get("type", "int")))
    return None


def spec_from_config(cfg: Mapping[str, Any], name: str = "model") -> ModelSpec:
    """Build a `ModelSpec` from a Hugging Face config dictionary.

    Reads the key spellings of the Llama, Qwen2/3, Mistral/Mixtral, Gemma 3, Phi-3,
    Qwen-MoE and DeepSeek config classes (a multimodal config's `text_config`, see
    `_text_config`); a missing or null `head_dim` defaults to hidden_size /
    num_attention_heads and missing `num_key_value_heads` to num_attention_heads (MHA).
    Every layer is counted with a full-context KV cache, sliding-window layers
    (Mistral, Gemma 3's `layer_types`) included, as radixlm's KV pool stores them.
    """
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = _text_config(cfg)
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    model_type = str(cfg.get("model_type", ""))
    num_experts = int(_get(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0))
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=0)) if num_experts else 0
    shared = 0
    if num_experts:
        moe_inter = moe_inter or int(cfg["intermediate_size"])
        if cfg.get("n_shared_experts"):
            shared = int(cfg["n_shared_experts"]) * moe_inter
        else:
            shared = int(_get(cfg, "shared_expert_intermediate_size", default=0))
    return ModelSpec(
        name=name,
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(_get(cfg, "num_key_value_heads", default=heads)),
        head_dim=int(_get(cfg, "head_dim", default=hidden // heads)),
        intermediate_size=int(_get(cfg, "intermediate_size", default=4 * hidden)),
        vocab_size=int(cfg["vocab_size"]),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_context=int(_get(cfg, "max_position_embeddings", default=0)),
        qkv_bias=bool(cfg.get("attention_bias", model_type in _QKV_BIAS_TYPES)),
        kv_lora_rank=int(_get(cfg, "kv_lora_rank", default=0)),
        q_lora_rank=int(_get(cfg, "q_lora_rank", default=0)),
        qk_nope_head_dim=int(_get(cfg, "qk_nope_head_dim", default=0)),
        qk_rope_head_dim=int(_get(cfg, "qk_rope_head_dim", default=0)),
        v_head_dim=int(_get(cfg, "v_head_dim", default=0)),
        num_experts=num_experts,
        experts_per_token=int(_get(cfg, "num_experts_per_tok", default=0)) if num_experts else 0,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared,
        num_dense_layers=_dense_layers(cfg) if num_experts else 0,
        shared_expert_gate=model_type == "qwen2_moe" and shared > 0,
        norms_per_layer=4 if model_type.startswith("gemma3") else 2,
        qk_norm=model_type in _QK_NORM_TYPES,
        checkpoint_dtype=checkpoint_dtype(cfg),
    )


def _dense_layers(cfg: dict) -> int:
    """Layers of an MoE config that keep a dense MLP: the first `first_k_dense_replace`
    (DeepSeek), those in `mlp_only_layers`, and those whose index + 1 is not a multiple
    of `decoder_sparse_step` (Qwen MoE)."""
    layers = int(cfg["num_hidden_layers"])
    first_dense = int(_get(cfg, "first_k_dense_replace", default=0))
    step = int(_get(cfg, "decoder_sparse_step", default=1)) or 1
    only_mlp = set(cfg.get("mlp_only_layers") or [])
    return sum(i < first_dense or i in only_mlp or (i + 1) % step != 0 for i in range(layers))


def preset_names() -> list[str]:
    return sorted(PRESETS)


def _find_preset(name: str) -> str | None:
    lowered = name.lower()
    for key in PRESETS:
        if key.lower() == lowered:
            return key
    return None


def load_model(model: str) -> ModelSpec:
    """Resolve `--model`: a built-in preset, a local config.json (or its directory), or a
    radixlm model alias (via the runtime's model registry, which may convert a GGUF once;
    the same config `radixlm.runtime.load_hf_config` returns).

    Raises:
        ModelNotFoundError: none of the three matches.
    """
    preset = _find_preset(model)
    if preset is not None:
        return spec_from_config(PRESETS[preset], name=preset)
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file() and path.suffix == ".json":
        return spec_from_config(json.loads(path.read_text()), name=path.parent.name or model)
    from radixlm import runtime

    try:
        # The registry's HF directory (a cached GGUF conversion for aliases) holds a
        # config.json; reading it directly avoids importing transformers (seconds).
        config_path = runtime.local_hf_dir(model) / "config.json"
        if config_path.is_file():
            return spec_from_config(json.loads(config_path.read_text()), name=model)
        config = runtime.load_hf_config(model)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"{exc}; built-in presets: {', '.join(preset_names())}") from exc
    return spec_from_config(config.to_dict(), name=model)
