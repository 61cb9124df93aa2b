"""Gemma 3 text decoder (`Gemma3ForCausalLM`, config `Gemma3TextConfig`, model_type
"gemma3_text").

Differences from Llama, all built from the shared blocks:
  * the embedding output is multiplied by sqrt(hidden) in the model dtype;
  * every RMSNorm (the four of each layer, q/k norm, the final one) scales by
    (1 + weight), computed in fp32 (`RMSNorm(unit_offset=True)`);
  * each layer normalises the outputs of attention and of the MLP before the residual
    add (`Gemma3DecoderLayer`);
  * GeGLU feed-forward (`hidden_activation` gelu_pytorch_tanh);
  * attention scale query_pre_attn_scalar ** -0.5;
  * `config.layer_types` interleaves "sliding_attention" layers (window
    `config.sliding_window`) with "full_attention" ones, each type with its own RoPE
    parameters (`RotaryByLayerType`: both tables computed once per step);
  * a tied head, optionally soft-capped (`final_logit_softcapping`).
Refused: `attn_logit_softcapping` (the attention backends have no score cap) and
`use_bidirectional_attention` (an encoder setting).

References: Gemma Team 2025 (Gemma 3 technical report); transformers 5.25
`models/gemma3/modeling_gemma3.py` for the exact arithmetic.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torch import nn

from radixlm.runtime.executor.layers.blocks import (
    AttentionOptions,
    DecoderLayer,
    RotaryByLayerType,
)
from radixlm.runtime.executor.models.decoder import CausalLM, refuse

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.base import LayerFactory

#: The `layer_types` entries Gemma 3 defines; the first one attends within the window.
LAYER_TYPES = ("sliding_attention", "full_attention")


class Gemma3DecoderLayer(DecoderLayer):
    """x + post_attention_layernorm(attn(input_layernorm(x))), then
    x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))), every norm
    unit-offset. Attention, MLP and norms come from `layers` (named under `prefix`);
    `mlp` replaces the dense GeGLU block when given.

    forward(x float [T, hidden], rope {layer type: (cos, sin)}, backend, fb) takes the RoPE
    tables of its own `layer_type`.
    """

    def __init__(
        self,
        config,
        layer_id: int,
        opts: AttentionOptions,
        layers: LayerFactory,
        prefix: str,
        mlp: nn.Module | None = None,
    ):
        super().__init__(config, layer_id, opts, layers, prefix, mlp)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.layer_type = opts.layer_type
        self.pre_feedforward_layernorm = layers.rms_norm(hidden, eps, unit_offset=True)
        self.post_feedforward_layernorm = layers.rms_norm(hidden, eps, unit_offset=True)

    def forward(self, x, rope: dict, backend, fb):
        h = self.self_attn(self.input_layernorm(x), rope[self.layer_type], backend, fb)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Gemma3ForCausalLM(CausalLM):
    """Gemma 3's text model (see the module docstring).

    Raises UnsupportedModelError naming `attn_logit_softcapping` when set,
    `use_bidirectional_attention` when true, `layer_types` with an entry outside
    `LAYER_TYPES`, and (from the RoPE block) `rope_parameters.rope_type` outside the
    static types.
    """

    unit_offset_norm = True
    scale_embedding = True

    @classmethod
    def check_config(cls, config) -> None:
        cap = getattr(config, "attn_logit_softcapping", None)
        if cap is not None:
            raise refuse("attn_logit_softcapping", cap, "attention scores are not soft-capped")
        if getattr(config, "use_bidirectional_attention", False):
            raise refuse("use_bidirectional_attention", True, "causal attention only")
        unknown = sorted(set(config.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise refuse("layer_types", unknown, f"supported: {list(LAYER_TYPES)}")

    def attention_options(self, config, layer_id: int) -> AttentionOptions:
        layer_type = config.layer_types[layer_id]
        sliding = layer_type == LAYER_TYPES[0]
        return dataclasses.replace(
            super().attention_options(config, layer_id),
            qk_norm=True,
            unit_offset_norm=True,
            sliding_window=config.sliding_window if sliding else None,
            scaling=config.query_pre_attn_scalar**-0.5,
            layer_type=layer_type,
        )

    def build_layer(self, config, layer_id: int, layers: LayerFactory, prefix: str) -> nn.Module:
        opts = self.attention_options(config, layer_id)
        mlp = self.feed_forward(config, layer_id, layers, f"{prefix}.mlp")
        return Gemma3DecoderLayer(config, layer_id, opts, layers, prefix, mlp)

    def rotary_embedding(self, config) -> nn.Module:
        return RotaryByLayerType(config)
