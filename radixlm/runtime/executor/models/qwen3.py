"""Qwen3 dense decoder: the Llama layout with a per-head RMSNorm of q and k before RoPE
(`q_norm`, `k_norm` [head_dim]), an explicit head_dim (q_proj may be wider than hidden),
no q/k/v/o biases unless `attention_bias`.

References: Qwen team 2025 (Qwen3 technical report); Dehghani et al. 2023 (QK-norm).
"""

from __future__ import annotations

import dataclasses

from radixlm.runtime.executor.layers.blocks import AttentionOptions
from radixlm.runtime.executor.models.decoder import CausalLM, layer_type_window


class Qwen3ForCausalLM(CausalLM):
    """Qwen3: q/k norm on every layer; layers listed "sliding_attention" in `layer_types`
    (`use_sliding_window` from `max_window_layers` on) attend within `sliding_window`."""

    def attention_options(self, config, layer_id: int) -> AttentionOptions:
        return dataclasses.replace(
            super().attention_options(config, layer_id),
            qk_norm=True,
            sliding_window=layer_type_window(config, layer_id),
        )
