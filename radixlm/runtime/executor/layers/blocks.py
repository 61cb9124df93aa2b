"""Plain-torch building blocks shared by the model families: RMSNorm (plain or Gemma's
unit-offset), RoPE (with the config's scaling, full or partial rotation, one table per
layer type where the config keeps several), GQA attention through the attention backend
(optional per-head q/k norm, sliding window, custom scale), the gated MLP (SwiGLU or
GeGLU), the pre-norm decoder layer, and the plain layer runner.
`TorchLayers` hands them out; the CPU factories subclass or wrap them. Parameter names
equal the Hugging Face ones.

References: Zhang & Sennrich 2019 (RMSNorm), Su et al. 2021 (RoPE), Ainslie et al. 2023
(GQA), Shazeer 2020 (GLU variants: SwiGLU, GeGLU), Touvron et al. 2023 (Llama 2's
pre-norm block), Beltagy et al. 2020 (sliding-window attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.errors import UnsupportedModelError
from radixlm.kernels import AttentionBackend

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.base import LayerFactory


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32 like the HF reference.

    With `unit_offset` (Gemma) the checkpoint's `weight` holds w - 1: the scale is
    (1 + weight), and `process_weights_after_loading` adds the 1 once, in fp32, so every
    implementation (this one, the C kernel) multiplies by the same stored w. That w stays
    fp32 and multiplies the fp32 normed x before the cast to x's dtype (`scale_fp32`), as
    transformers' Gemma3RMSNorm does; the plain norm casts first, then scales (Llama's
    order).
    """

    #: Whether the scale is applied in fp32, before the cast back (unit-offset norms).
    scale_fp32 = False

    def __init__(self, dim: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.unit_offset = unit_offset

    def process_weights_after_loading(self) -> None:
        if self.unit_offset:
            self.weight.data = self.weight.data.float().add_(1.0)
            self.unit_offset = False  # the stored weight is now the scale itself
            self.scale_fp32 = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_fp32:
            return (x * self.weight).to(dtype)
        return self.weight * x.to(dtype)


#: RoPE types whose frequencies depend only on the config (transformers'
#: `ROPE_INIT_FUNCTIONS` computes them once). "dynamic" and "longrope" change with the
#: sequence length of the batch, which per-request serving cannot reproduce.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


def rope_parameters(config, layer_type: str | None = None) -> dict:
    """The config's RoPE parameters (transformers 5 `rope_parameters`, one dict per layer
    type where the config keeps several). Raises UnsupportedModelError naming the field
    for a RoPE type outside `STATIC_ROPE_TYPES`."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    rope_type = params.get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_parameters.rope_type {rope_type!r} is not supported; "
            f"supported: {list(STATIC_ROPE_TYPES)}"
        )
    return params


class RotaryEmbedding(nn.Module):
    """RoPE with the config's theta and scaling (inv_freq from transformers' rope utilities),
    rotating the first `rotary_dim` = head_dim * partial_rotary_factor dims of each head.

    Applied to q [T, H, D] and k [T, Hkv, D] at int64 positions [T] (rotate-half layout).

    Args:
        config: the transformers config.
        layer_type: which of the config's per-layer-type RoPE dicts to use (Gemma 3's
            "sliding_attention" / "full_attention"); None for configs with one.
    Raises UnsupportedModelError for a RoPE type outside `STATIC_ROPE_TYPES`.
    """

    def __init__(self, config, layer_type: str | None = None):
        super().__init__()
        params = rope_parameters(config, layer_type)
        rope_type = params.get("rope_type", "default")
        self.rotary_dim = rotary_dim_of(config, layer_type)
        # Real CPU tensors even when the model is built under a meta-device context.
        with torch.device("cpu"):
            if rope_type == "default":
                theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
                dim = self.rotary_dim
                exponent = torch.arange(0, dim, 2, dtype=torch.float) / dim
                inv_freq, scale = 1.0 / (theta**exponent), 1.0
            else:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                kwargs = {"layer_type": layer_type} if layer_type is not None else {}
                inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", **kwargs)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = scale

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin tables [T, 1, rotary_dim] for int64 positions [T] (once per step)."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)[:, None, :]
        sin = (emb.sin() * self.attention_scaling).to(dtype)[:, None, :]
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by the per-token angles (rotate-half layout) over its
    first cos.shape[-1] dims (all of them unless the rotation is partial)."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + _rotate_half(head) * sin, tail), dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def head_dim_of(config) -> int:
    """Per-head size: config.head_dim, else hidden_size / num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_dim_of(config, layer_type: str | None = None) -> int:
    """Dims of each head that RoPE rotates: head_dim * partial_rotary_factor (from the RoPE
    parameters of `layer_type`, else the config; 1.0 when neither sets it). Raises
    UnsupportedModelError as `rope_parameters`."""
    params = rope_parameters(config, layer_type)
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return int(head_dim_of(config) * (factor or 1.0))


class RotaryByLayerType(nn.Module):
    """One `RotaryEmbedding` per distinct entry of `config.layer_types`, each from that
    type's RoPE parameters (Gemma 3: "sliding_attention" and "full_attention" differ in
    theta and scaling). forward(positions, dtype) -> {layer type: (cos, sin)}, every table
    computed once per step; a layer takes the entry of its own type (`AttentionOptions.
    layer_type`). Raises UnsupportedModelError as `RotaryEmbedding`."""

    def __init__(self, config):
        super().__init__()
        self.tables = nn.ModuleDict(
            {t: RotaryEmbedding(config, t) for t in sorted(set(config.layer_types))}
        )

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple]:
        return {t: rope(positions, dtype) for t, rope in self.tables.items()}


@dataclass(frozen=True)
class AttentionOptions:
    """How one layer's attention differs between families.

    Attributes:
        qkv_bias: biases on q/k/v (Qwen2, Llama's attention_bias).
        o_bias: a bias on o_proj (Llama's attention_bias).
        qk_norm: per-head RMSNorm of q and k (`q_norm`, `k_norm` [head_dim]) before RoPE
            (Qwen3, Gemma 3).
        unit_offset_norm: those norms scale by (1 + weight) (Gemma).
        sliding_window: keys older than this many positions are masked (Mistral, Gemma 3's
            local layers), None for full causal attention.
        scaling: the softmax scale; None for head_dim ** -0.5.
        layer_type: the config's `layer_types` entry of this layer, naming its RoPE
            parameters and tables (`RotaryByLayerType`); None where the config has one RoPE.
    """

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    unit_offset_norm: bool = False
    sliding_window: int | None = None
    scaling: float | None = None
    layer_type: str | None = None


class Attention(nn.Module):
    """GQA self-attention: q/k/v projections, optional q/k norm, RoPE, backend attention,
    output projection. The projections are `layers.linear` modules named
    `{prefix}.q_proj` etc.; the norms `layers.rms_norm` modules `{prefix}.q_norm`/`k_norm`.

    `sliding_window` and `scaling` are read by the model runner, which hands them to the
    attention backend (windows per layer, one scale per model); `rotary_dim` (the rotated
    dims of each head) by the CPU layout, whose fused decode layer rotates whole heads.
    """

    def __init__(
        self, config, layer_id: int, opts: AttentionOptions, layers: LayerFactory, prefix: str
    ):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.rotary_dim = rotary_dim_of(config, opts.layer_type)
        self.sliding_window = opts.sliding_window
        self.scaling = opts.scaling if opts.scaling is not None else self.head_dim**-0.5
        hidden, q_out = config.hidden_size, self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        self.q_proj = layers.linear(f"{prefix}.q_proj", hidden, q_out, opts.qkv_bias)
        self.k_proj = layers.linear(f"{prefix}.k_proj", hidden, kv_out, opts.qkv_bias)
        self.v_proj = layers.linear(f"{prefix}.v_proj", hidden, kv_out, opts.qkv_bias)
        self.o_proj = layers.linear(f"{prefix}.o_proj", q_out, hidden, opts.o_bias)
        self.q_norm = self.k_norm = None
        if opts.qk_norm:
            eps, offset = config.rms_norm_eps, opts.unit_offset_norm
            self.q_norm = layers.rms_norm(self.head_dim, eps, unit_offset=offset)
            self.k_norm = layers.rms_norm(self.head_dim, eps, unit_offset=offset)

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], backend: AttentionBackend, fb):
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = backend.forward(q, k, v, self.layer_id, fb)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


#: Gate activations of the gated MLP by the config's `hidden_act` / `hidden_activation`.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def activation_of(config) -> str:
    """The config's gate activation name (`hidden_activation`, else `hidden_act`).
    Raises UnsupportedModelError naming the field when it is not in `ACTIVATIONS`."""
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if name not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"hidden_act {name!r} is not supported; supported: {sorted(ACTIVATIONS)}"
        )
    return name


class MLP(nn.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)), SwiGLU for act = silu and GeGLU for
    gelu (Shazeer 2020), of `layers.linear` projections named `{prefix}.gate_proj` etc."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        layers: LayerFactory,
        prefix: str,
        activation: str = "silu",
    ):
        super().__init__()
        self.activation = activation
        self._act = ACTIVATIONS[activation]
        self.gate_proj = layers.linear(f"{prefix}.gate_proj", hidden, intermediate, False)
        self.up_proj = layers.linear(f"{prefix}.up_proj", hidden, intermediate, False)
        self.down_proj = layers.linear(f"{prefix}.down_proj", intermediate, hidden, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); its attention and norms
    come from `layers` (named under `prefix`, e.g. "model.layers.0"; the norms unit-offset
    where `opts.unit_offset_norm`), its feed-forward block is `mlp` when given (a mixture
    of experts) else `layers.mlp` of the config's intermediate size and activation."""

    def __init__(
        self,
        config,
        layer_id: int,
        opts: AttentionOptions,
        layers: LayerFactory,
        prefix: str,
        mlp: nn.Module | None = None,
    ):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = layers.attention(config, layer_id, opts, f"{prefix}.self_attn")
        if mlp is None:
            inter, act = config.intermediate_size, activation_of(config)
            mlp = layers.mlp(hidden, inter, f"{prefix}.mlp", act)
        self.mlp = mlp
        self.input_layernorm = layers.rms_norm(hidden, eps, opts.unit_offset_norm)
        self.post_attention_layernorm = layers.rms_norm(hidden, eps, opts.unit_offset_norm)

    def forward(self, x, rope, backend, fb):
        x = x + self.self_attn(self.input_layernorm(x), rope, backend, fb)
        return x + self.mlp(self.post_attention_layernorm(x))


def run_in_order(layers: nn.ModuleList, x, rope, backend, fb) -> torch.Tensor:
    """The decoder layers one after another: x float [T, hidden] -> [T, hidden]. The
    plain layer runner (`LayerFactory.layer_runner`)."""
    for layer in layers:
        x = layer(x, rope, backend, fb)
    return x
