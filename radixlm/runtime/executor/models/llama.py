"""Llama-family decoders: Llama, Mistral (sliding window), Qwen2 (q/k/v biases, sliding
layers by `layer_types`).

RoPE, RMSNorm, GQA, SwiGLU, tied or untied head, all from the shared blocks.
References: Touvron et al. 2023 (Llama 2), Jiang et al. 2023 (Mistral 7B: sliding-window
attention), Qwen team 2024 (Qwen2 technical report).
"""

from __future__ import annotations

import dataclasses

from radixlm.runtime.executor.layers.blocks import AttentionOptions
from radixlm.runtime.executor.models.decoder import CausalLM, layer_type_window


class LlamaForCausalLM(CausalLM):
    """Llama: `attention_bias` biases q/k/v and o."""


class MistralForCausalLM(CausalLM):
    """Mistral: Llama with every layer attending over the last `sliding_window` positions
    (None: full attention)."""

    def attention_options(self, config, layer_id: int) -> AttentionOptions:
        opts = super().attention_options(config, layer_id)
        return dataclasses.replace(opts, sliding_window=getattr(config, "sliding_window", None))


class Qwen2ForCausalLM(CausalLM):
    """Qwen2: the Llama layout with biases on the q/k/v projections (not o); layers listed
    "sliding_attention" in `layer_types` attend within `sliding_window`."""

    qkv_bias_default = True
    o_bias_with_attention_bias = False

    def attention_options(self, config, layer_id: int) -> AttentionOptions:
        opts = super().attention_options(config, layer_id)
        return dataclasses.replace(opts, sliding_window=layer_type_window(config, layer_id))
