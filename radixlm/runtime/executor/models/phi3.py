"""Phi-3 / Phi-4-mini decoders: the Mistral layout (a sliding window on every layer when
the config sets one) whose checkpoint fuses q/k/v into `self_attn.qkv_proj` and gate/up
into `mlp.gate_up_proj`; RoPE may rotate only the first head_dim * partial_rotary_factor
dims of each head (Phi-4-mini). "longrope" RoPE (Phi-3-*-128k) is refused by the RoPE
block (`rope_parameters.rope_type`).

References: Abdin et al. 2024 (Phi-3 technical report), Microsoft 2025 (Phi-4-mini
technical report).
"""

from __future__ import annotations

import torch

from radixlm.errors import WeightsMismatchError
from radixlm.runtime.executor.layers.blocks import head_dim_of
from radixlm.runtime.executor.models.llama import MistralForCausalLM

_QKV = ".self_attn.qkv_proj.weight"
_GATE_UP = ".mlp.gate_up_proj.weight"
#: Each split parameter's suffix -> the fused checkpoint tensor's suffix.
_FUSED = {
    ".self_attn.q_proj.weight": _QKV,
    ".self_attn.k_proj.weight": _QKV,
    ".self_attn.v_proj.weight": _QKV,
    ".mlp.gate_proj.weight": _GATE_UP,
    ".mlp.up_proj.weight": _GATE_UP,
}


class Phi3ForCausalLM(MistralForCausalLM):
    """Phi-3: Mistral's blocks over split fused checkpoint tensors."""

    @classmethod
    def adapt_checkpoint(cls, state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
        """Split every `qkv_proj.weight` [(H + 2 Hkv) D, hidden] into q_proj [H D, hidden],
        k_proj and v_proj [Hkv D, hidden] (that order), and every `gate_up_proj.weight`
        [2 I, hidden] into gate_proj and up_proj [I, hidden] (gate first, as
        transformers' Phi3MLP chunks it). The parts are views of the fused tensor.
        Raises WeightsMismatchError naming a fused tensor of the wrong shape."""
        d, hidden = head_dim_of(config), config.hidden_size
        q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
        inter = config.intermediate_size
        out: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if name.endswith(_QKV):
                parts = _split(name, tensor, (q, kv, kv), hidden)
                stem = name[: -len(_QKV)] + ".self_attn."
                out.update({f"{stem}{p}_proj.weight": w for p, w in zip("qkv", parts)})
            elif name.endswith(_GATE_UP):
                gate, up = _split(name, tensor, (inter, inter), hidden)
                stem = name[: -len(_GATE_UP)] + ".mlp."
                out[f"{stem}gate_proj.weight"], out[f"{stem}up_proj.weight"] = gate, up
            else:
                out[name] = tensor
        return out

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        for split, fused in _FUSED.items():
            if name.endswith(split):
                return name[: -len(split)] + fused
        return name


def _split(name: str, tensor: torch.Tensor, rows: tuple[int, ...], cols: int) -> tuple:
    """`tensor` [sum(rows), cols] split along dim 0 into [rows[i], cols] views. Raises
    WeightsMismatchError naming `name` when its shape differs."""
    expected = (sum(rows), cols)
    if tuple(tensor.shape) != expected:
        raise WeightsMismatchError(
            f"checkpoint does not match its config: wrong shapes [{name}: checkpoint "
            f"{tuple(tensor.shape)}, config expects {expected}]"
        )
    return tensor.split(rows, dim=0)
