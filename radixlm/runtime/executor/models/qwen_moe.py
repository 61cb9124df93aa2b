"""Qwen2-MoE and Qwen3-MoE: Qwen attention with sparse mixture-of-experts blocks
(softmax router, top-k renormalised where `norm_topk_prob`; Qwen2-MoE adds a shared
expert scaled by a sigmoid gate). Layer i is sparse unless it is listed in
`mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`; those layers
keep a dense SwiGLU MLP of `intermediate_size`.

References: Qwen team 2024 (Qwen2 technical report, Qwen1.5-MoE), Qwen team 2025 (Qwen3
technical report).
"""

from __future__ import annotations

import dataclasses

from radixlm.runtime.executor.layers.blocks import AttentionOptions
from radixlm.runtime.executor.models.decoder import CausalLM
from radixlm.runtime.executor.models.llama import Qwen2ForCausalLM
from radixlm.runtime.executor.models.mixtral import moe_options


def is_sparse_layer(config, layer_id: int) -> bool:
    """Whether layer `layer_id` holds experts (the rule of transformers' Qwen MoE models)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = layer_id in (getattr(config, "mlp_only_layers", None) or [])
    return not dense and config.num_experts > 0 and (layer_id + 1) % step == 0


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    """Qwen2-MoE: Qwen2's attention (q/k/v biases, windows by `layer_types`), sparse
    layers with a shared expert and its gate."""

    def feed_forward(self, config, layer_id, layers, prefix):
        if not is_sparse_layer(config, layer_id):
            return None
        return layers.moe(moe_options(config), prefix)


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    """Qwen3-MoE: Qwen3 attention (per-head q/k RMSNorm, no q/k/v bias unless
    `attention_bias`), experts without a shared one. Its config has no `layer_types`:
    as in transformers, every layer attends within `sliding_window` when it is set."""

    qkv_bias_default = False
    o_bias_with_attention_bias = True

    def attention_options(self, config, layer_id: int) -> AttentionOptions:
        opts = CausalLM.attention_options(self, config, layer_id)
        window = getattr(config, "sliding_window", None)
        return dataclasses.replace(opts, qk_norm=True, sliding_window=window)
