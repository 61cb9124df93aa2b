"""DeepSeek-V2 and DeepSeek-V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`; Kimi-K2
configs name the V3 class): multi-head latent attention over a latent KV cache, the first
`first_k_dense_replace` layers with a dense SwiGLU MLP, the rest with DeepSeek MoE blocks
(routed experts plus `n_shared_experts` shared ones run as one SwiGLU of
n_shared_experts * moe_intermediate_size).

  * Attention: `layers.mla.MLAAttention` (q with or without LoRA, the KV latent and the
    decoupled RoPE key, YaRN with its softmax-scale correction). V2 rotates interleaved
    pairs; V3 where `rope_interleave` (its default), else halves. Decode and verify run the
    absorbed form, EXTEND steps the absorbed or the expanded form by cost: the model's
    `attention_forms` (`layers.mla_forms.MLAForms`, one per model; its `mode` forces a form).
  * KV cache: `memory.LatentKVPool`, kv_lora_rank + qk_rope_head_dim values per token and
    layer (`kv_bytes_per_token`, equal to `radixlm plan kv`).
  * Routing (`layers.moe`): V2 softmax scores, top-k `greedy` or `group_limited_greedy`
    (groups scored by their best expert), weights not renormalised, times
    routed_scaling_factor. V3 sigmoid scores plus `e_score_correction_bias` for the choice,
    groups scored by their best two, top-k weights renormalised where `norm_topk_prob`,
    times routed_scaling_factor; the router's weight and bias stay float32.
Checkpoints: the shared experts' `mlp.shared_experts.*` load into the MoE block's
`shared_expert`; multi-token-prediction layers past `num_hidden_layers` (V3's layer 61)
are dropped.

Refused at load, naming the field (`check_config`): `quantization_config` (FP8 block
weights), a `hidden_act` other than silu, `mlp_bias`, `moe_layer_freq` other than 1,
V2's `topk_method` other than greedy / group_limited_greedy, `scoring_func` other than
softmax, `norm_topk_prob` (transformers' V2 ignores it, DeepSeek's own code renormalises:
no single reference), and V3's `topk_method` other than noaux_tc, `scoring_func` other than
sigmoid, missing `n_group` / `topk_group`.

References: DeepSeek-AI 2024 (DeepSeek-V2, sections 2.1-2.2), DeepSeek-AI 2024
(DeepSeek-V3 technical report, sections 2.1.1-2.1.2), Peng et al. 2023 (YaRN);
transformers 5.25 `models/deepseek_v{2,3}/modeling_*.py` for the exact arithmetic.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.errors import UnsupportedModelError
from radixlm.runtime.executor.layers.blocks import activation_of
from radixlm.runtime.executor.layers.mla import MLAAttention
from radixlm.runtime.executor.layers.mla_forms import MLAForms
from radixlm.runtime.executor.layers.moe import MoEOptions
from radixlm.runtime.executor.memory import LatentKVPool, latent_kv_bytes_per_token
from radixlm.runtime.executor.models.decoder import CausalLM, refuse

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.base import LayerFactory

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def mla_kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Latent KV bytes per token of a DeepSeek config in `dtype`: num_hidden_layers *
    (kv_lora_rank + qk_rope_head_dim) * element size (DeepSeek-V3, bf16: 70,272)."""
    return latent_kv_bytes_per_token(
        config.num_hidden_layers, config.kv_lora_rank, config.qk_rope_head_dim, dtype
    )


class MLADecoderLayer(nn.Module):
    """Pre-norm block x + attn(norm(x)), then x + mlp(norm(x)), whose attention is
    `MLAAttention`; norms and the dense MLP come from `layers`, `mlp` (an MoE block)
    replaces the dense one when given; `forms` is the model's `MLAForms`. forward(x float
    [T, hidden], rope, backend, fb)."""

    def __init__(
        self,
        config,
        layer_id: int,
        layers: LayerFactory,
        prefix: str,
        interleaved_rope: bool,
        forms: MLAForms,
        mlp: nn.Module | None = None,
    ):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = MLAAttention(
            config, layer_id, layers, f"{prefix}.self_attn", interleaved_rope, forms
        )
        if mlp is None:
            act = activation_of(config)
            mlp = layers.mlp(hidden, config.intermediate_size, f"{prefix}.mlp", act)
        self.mlp = mlp
        self.input_layernorm = layers.rms_norm(hidden, eps)
        self.post_attention_layernorm = layers.rms_norm(hidden, eps)

    def forward(self, x, rope, backend, fb):
        x = x + self.self_attn(self.input_layernorm(x), rope, backend, fb)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekV2ForCausalLM(CausalLM):
    """DeepSeek-V2 (see the module docstring)."""

    #: The routed experts' scoring ("softmax" or "sigmoid") and the `topk_method` names
    #: accepted, each with whether it limits the choice to groups.
    router = "softmax"
    topk_methods = {"greedy": False, "group_limited_greedy": True}

    @classmethod
    def check_config(cls, config) -> None:
        if getattr(config, "quantization_config", None):
            method = config.quantization_config.get("quant_method", "?")
            raise refuse("quantization_config", method, "unquantized checkpoints only")
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise refuse("hidden_act", act, "supported: silu")
        if getattr(config, "mlp_bias", False):
            raise refuse("mlp_bias", True, "MLPs without biases only")
        freq = getattr(config, "moe_layer_freq", 1)
        if freq != 1:
            raise refuse("moe_layer_freq", freq, "every layer from first_k_dense_replace on")
        method = getattr(config, "topk_method", None) or next(iter(cls.topk_methods))
        if method not in cls.topk_methods:
            raise refuse("topk_method", method, f"supported: {sorted(cls.topk_methods)}")
        scoring = getattr(config, "scoring_func", None) or cls.router
        if scoring != cls.router:
            raise refuse("scoring_func", scoring, f"supported: {cls.router}")
        if cls.topk_methods[method]:
            for field in ("n_group", "topk_group"):
                if not getattr(config, field, None):
                    raise refuse(field, getattr(config, field, None), f"{method} needs it")
        cls._check_norm_topk_prob(config)
        if config.head_dim != config.qk_rope_head_dim:
            raise refuse("head_dim", config.head_dim, "must equal qk_rope_head_dim")

    @classmethod
    def _check_norm_topk_prob(cls, config) -> None:
        if getattr(config, "norm_topk_prob", False):
            raise refuse("norm_topk_prob", True, "DeepSeek-V2 routing is not renormalised")

    @classmethod
    def interleaved_rope(cls, config) -> bool:
        """Whether RoPE rotates interleaved pairs (V2: always)."""
        return True

    @classmethod
    def moe_options(cls, config) -> MoEOptions:
        """The MoE block's options from the config. Raises UnsupportedModelError naming the
        fields when they do not form a valid block."""
        method = getattr(config, "topk_method", None) or next(iter(cls.topk_methods))
        grouped = cls.topk_methods[method]
        shared = config.n_shared_experts or 0
        try:
            return MoEOptions(
                num_experts=config.n_routed_experts,
                top_k=config.num_experts_per_tok,
                hidden=config.hidden_size,
                intermediate=config.moe_intermediate_size,
                router=cls.router,
                norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
                shared_intermediate=shared * config.moe_intermediate_size if shared else None,
                num_groups=config.n_group if grouped else 1,
                topk_groups=config.topk_group if grouped else 1,
                group_score="max" if cls.router == "softmax" else "top2_sum",
                correction_bias=cls.router == "sigmoid",
                routed_scaling_factor=float(config.routed_scaling_factor),
            )
        except ValueError as exc:
            fields = (
                "n_routed_experts, num_experts_per_tok, moe_intermediate_size, "
                "n_shared_experts, n_group, topk_group"
            )
            raise UnsupportedModelError(f"MoE config fields ({fields}): {exc}") from None

    @classmethod
    def adapt_checkpoint(cls, state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
        out = {}
        for name, tensor in state.items():
            layer = _LAYER.match(name)
            if layer and int(layer[1]) >= config.num_hidden_layers:
                continue  # a multi-token-prediction module: not part of the decoder
            out[name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")] = tensor
        return out

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        return name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")

    def feed_forward(self, config, layer_id, layers, prefix):
        if not config.n_routed_experts or layer_id < config.first_k_dense_replace:
            return None
        return layers.moe(self.moe_options(config), prefix)

    def build_layer(self, config, layer_id: int, layers: LayerFactory, prefix: str) -> nn.Module:
        mlp = self.feed_forward(config, layer_id, layers, f"{prefix}.mlp")
        interleaved = self.interleaved_rope(config)
        forms = self.attention_forms
        return MLADecoderLayer(config, layer_id, layers, prefix, interleaved, forms, mlp)

    @functools.cached_property
    def attention_forms(self) -> MLAForms:
        """The one `MLAForms` every layer's attention shares (mode "auto"; assign its
        `mode` to force the absorbed or the expanded form on EXTEND steps)."""
        c = self.config
        return MLAForms(c.kv_lora_rank, c.qk_nope_head_dim, c.v_head_dim)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return mla_kv_bytes_per_token(self.config, dtype)

    def create_kv_pool(
        self, num_slots: int, dtype: torch.dtype, device, padding_slots: int
    ) -> LatentKVPool:
        c = self.config
        return LatentKVPool(
            num_slots,
            c.num_hidden_layers,
            c.kv_lora_rank,
            c.qk_rope_head_dim,
            dtype,
            device,
            padding_slots=padding_slots,
        )


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 and Kimi-K2 (see the module docstring)."""

    router = "sigmoid"
    topk_methods = {"noaux_tc": True}
    fp32_tensors = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")

    @classmethod
    def _check_norm_topk_prob(cls, config) -> None:
        """V3 renormalises where `norm_topk_prob` (nothing to refuse)."""

    @classmethod
    def interleaved_rope(cls, config) -> bool:
        return bool(getattr(config, "rope_interleave", True))
