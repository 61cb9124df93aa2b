"""Mixtral: the Mistral decoder with a sparse mixture of experts in every layer (softmax
router, top-k renormalised, SwiGLU experts; Jiang et al. 2024, "Mixtral of Experts").

The checkpoint names the block `block_sparse_moe` and an expert's projections w1 (gate),
w3 (up) and w2 (down); `adapt_checkpoint` maps them onto the shared MoE block's names
(`mlp.gate`, `mlp.experts.{e}.{gate,up,down}_proj`).
"""

from __future__ import annotations

import re

import torch

from radixlm.errors import UnsupportedModelError
from radixlm.runtime.executor.layers.moe import MoEOptions
from radixlm.runtime.executor.models.llama import MistralForCausalLM

_EXPERT = re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.")
_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MOE_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.")
_W = {proj: w for w, proj in _PROJ.items()}


class MixtralForCausalLM(MistralForCausalLM):
    """Mixtral: Mistral attention (sliding window where the config sets one) and an MoE
    feed-forward block per layer."""

    @classmethod
    def adapt_checkpoint(cls, state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
        out = {}
        for name, tensor in state.items():
            name = _EXPERT.sub(lambda m: f".mlp.experts.{m[1]}.{_PROJ[m[2]]}.", name)
            out[name.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = tensor
        return out

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        name = _MOE_EXPERT.sub(lambda m: f".block_sparse_moe.experts.{m[1]}.{_W[m[2]]}.", name)
        return name.replace(".mlp.gate.", ".block_sparse_moe.gate.")

    def feed_forward(self, config, layer_id, layers, prefix):
        return layers.moe(moe_options(config), prefix)


def moe_options(config) -> MoEOptions:
    """The config's MoE options. Raises UnsupportedModelError naming what the block does
    not implement."""
    try:
        return MoEOptions.from_config(config)
    except ValueError as exc:
        fields = "num_experts_per_tok, num_local_experts / num_experts, hidden_act"
        raise UnsupportedModelError(f"MoE config fields ({fields}): {exc}") from None
