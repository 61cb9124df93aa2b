"""Llama-family decoder (Llama, Mistral, Qwen2): RoPE, RMSNorm, GQA, SwiGLU, tied or untied head.

Parameter names equal the Hugging Face ones, so a HF state dict loads directly. Every
projection, norm, attention, MLP, decoder layer, head and the runner of the layer stack
comes from the `LayerFactory` the model is built with (`runtime/executor/layers/`); the
classes here are the plain-torch implementations `TorchLayers` hands out. Attention goes
through the `AttentionBackend` the caller passes; the model never branches on it.
Reference: Touvron et al. 2023 (Llama 2), Su et al. 2021 (RoPE), Zhang & Sennrich 2019 (RMSNorm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import AttentionBackend, ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers import LayerFactory


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
        head_dim = _head_dim(config)
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


def _head_dim(config) -> int:
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
        self.head_dim = _head_dim(config)
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


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm. `run_layers(layers, x, rope, backend, fb)`
    is what runs the layers: `run_in_order` until the weights are loaded, then the one
    `layers.layer_runner` picks for the final layers (`process_weights_after_loading`)."""

    def __init__(self, config, qkv_bias: bool, o_bias: bool, layers: LayerFactory):
        super().__init__()
        self.run_layers = run_in_order
        self._layer_runner = layers.layer_runner
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            layers.decoder_layer(config, i, qkv_bias, o_bias, f"model.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = layers.rms_norm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)

    def process_weights_after_loading(self) -> None:
        """Pick the layer runner once the layers hold their final weights (the loader calls
        this after every layer's own post-load step)."""
        self.run_layers = self._layer_runner(self.layers)


class LlamaForCausalLM(nn.Module):
    """Causal LM over a `ForwardBatch`; returns fp32 logits of each request's last token.

    Args:
        config: a transformers Llama/Mistral/Qwen2 config.
        layers: the `LayerFactory` every block and the head come from.
    """

    qkv_bias_default = False
    #: Whether `attention_bias` also biases o_proj (Llama: q/k/v/o; Qwen2: q/k/v only).
    o_bias_with_attention_bias = True
    #: When True, `forward` keeps the normed last hidden states of every new token
    #: (float [T, hidden]) in `last_hidden` (EAGLE drafting reads them).
    capture_hidden = False
    last_hidden: torch.Tensor | None = None

    def __init__(self, config, layers: LayerFactory):
        super().__init__()
        self.config = config
        qkv_bias = getattr(config, "attention_bias", self.qkv_bias_default)
        o_bias = self.o_bias_with_attention_bias and bool(getattr(config, "attention_bias", False))
        self.model = LlamaModel(config, qkv_bias, o_bias, layers)
        self.lm_head = layers.lm_head(config.hidden_size, config.vocab_size)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        """Run one step. Returns float32 logits of each request's last new token [B, vocab]
        (EXTEND, DECODE; in EXTEND of the tokens `fb.logits_index()` selects, [R, vocab])
        or of every new token [T, vocab] (TARGET_VERIFY).

        The caller has run `backend.init_forward_metadata(fb)` for this step (outside any
        CUDA graph that captures this call).
        """
        x = self.model.embed_tokens(fb.input_ids)
        rope = self.model.rotary_emb(fb.positions, x.dtype)
        x = self.model.run_layers(self.model.layers, x, rope, backend, fb)
        if self.capture_hidden:  # speculative drafters read every token's final state
            x = self.last_hidden = self.model.norm(x)
            if fb.mode is ForwardMode.EXTEND:
                x = x[fb.logits_index()]
            return self._logits(x, fb)
        if fb.mode is ForwardMode.EXTEND:
            x = x[fb.logits_index()]
        x = self.model.norm(x)
        return self._logits(x, fb)

    def _logits(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """The head over final states x [R, hidden]: float32 [R, vocab]. An argmax-only
        batch takes the head's `argmax_logits` where it has one (`PackedHead`)."""
        head = getattr(self.lm_head, "argmax_logits", None) if fb.argmax_only else None
        return (head or self.lm_head)(x).float()


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: the Llama layout with biases on the q/k/v projections."""

    qkv_bias_default = True
    o_bias_with_attention_bias = False
