"""Plain-torch building blocks shared by the model families: RMSNorm, RoPE (with the
config's scaling), GQA attention through the attention backend, the SwiGLU MLP, the
pre-norm decoder layer, and the plain layer runner. `TorchLayers` hands them out; the CPU
factories subclass or wrap them. Parameter names equal the Hugging Face ones.

References: Zhang & Sennrich 2019 (RMSNorm), Su et al. 2021 (RoPE), Ainslie et al. 2023
(GQA), Shazeer 2020 (SwiGLU), Touvron et al. 2023 (Llama 2's pre-norm block).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import AttentionBackend

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.base import LayerFactory


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32 like the HF reference."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """RoPE with the config's theta and scaling (inv_freq from transformers' rope utilities).

    Applied to q [T, H, D] and k [T, Hkv, D] at int64 positions [T] (rotate-half layout).
    """

    def __init__(self, config):
        super().__init__()
        params = getattr(config, "rope_parameters", None) or {}
        rope_type = params.get("rope_type", "default")
        head_dim = head_dim_of(config)
        # Real CPU tensors even when the model is built under a meta-device context.
        with torch.device("cpu"):
            if rope_type == "default":
                theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
                exponent = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim
                inv_freq, scale = 1.0 / (theta**exponent), 1.0
            else:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = scale

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin tables [T, 1, head_dim] for int64 positions [T] (computed once per step)."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)[:, None, :]
        sin = (emb.sin() * self.attention_scaling).to(dtype)[:, None, :]
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by the per-token angles (rotate-half layout)."""
    return x * cos + _rotate_half(x) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def head_dim_of(config) -> int:
    """Per-head size: config.head_dim, else hidden_size / num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Attention(nn.Module):
    """GQA self-attention: q/k/v projections, RoPE, backend attention, output projection.
    The projections are `layers.linear` modules named `{prefix}.q_proj` etc."""

    def __init__(
        self, config, layer_id: int, qkv_bias: bool, o_bias: bool, layers: LayerFactory, prefix: str
    ):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        hidden, q_out = config.hidden_size, self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        self.q_proj = layers.linear(f"{prefix}.q_proj", hidden, q_out, qkv_bias)
        self.k_proj = layers.linear(f"{prefix}.k_proj", hidden, kv_out, qkv_bias)
        self.v_proj = layers.linear(f"{prefix}.v_proj", hidden, kv_out, qkv_bias)
        self.o_proj = layers.linear(f"{prefix}.o_proj", q_out, hidden, o_bias)

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], backend: AttentionBackend, fb):
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = backend.forward(q, k, v, self.layer_id, fb)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)) (Shazeer 2020), of `layers.linear`
    projections named `{prefix}.gate_proj` etc."""

    def __init__(self, hidden: int, intermediate: int, layers: LayerFactory, prefix: str):
        super().__init__()
        self.gate_proj = layers.linear(f"{prefix}.gate_proj", hidden, intermediate, False)
        self.up_proj = layers.linear(f"{prefix}.up_proj", hidden, intermediate, False)
        self.down_proj = layers.linear(f"{prefix}.down_proj", intermediate, hidden, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); its attention, MLP and
    norms come from `layers` (named under `prefix`, e.g. "model.layers.0")."""

    def __init__(
        self, config, layer_id: int, qkv_bias: bool, o_bias: bool, layers: LayerFactory, prefix: str
    ):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = layers.attention(config, layer_id, qkv_bias, o_bias, f"{prefix}.self_attn")
        self.mlp = layers.mlp(hidden, config.intermediate_size, f"{prefix}.mlp")
        self.input_layernorm = layers.rms_norm(hidden, eps)
        self.post_attention_layernorm = layers.rms_norm(hidden, eps)

    def forward(self, x, rope, backend, fb):
        x = x + self.self_attn(self.input_layernorm(x), rope, backend, fb)
        return x + self.mlp(self.post_attention_layernorm(x))


def run_in_order(layers: nn.ModuleList, x, rope, backend, fb) -> torch.Tensor:
    """The decoder layers one after another: x float [T, hidden] -> [T, hidden]. The
    plain layer runner (`LayerFactory.layer_runner`)."""
    for layer in layers:
        x = layer(x, rope, backend, fb)
    return x
