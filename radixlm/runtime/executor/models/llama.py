"""Llama-family decoder (Llama, Mistral, Qwen2): RoPE, RMSNorm, GQA, SwiGLU, tied or untied head.

Parameter names equal the Hugging Face ones, so a HF state dict loads directly. Every
projection, norm, attention, MLP, decoder layer, head and the runner of the layer stack
comes from the `LayerFactory` the model is built with (`runtime/executor/layers/`; the
plain-torch blocks are in `layers/blocks.py`). Attention goes through the
`AttentionBackend` the caller passes; the model never branches on it.
Reference: Touvron et al. 2023 (Llama 2), Su et al. 2021 (RoPE), Zhang & Sennrich 2019 (RMSNorm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.kernels import AttentionBackend, ForwardBatch, ForwardMode
from radixlm.runtime.executor.layers.blocks import RotaryEmbedding, run_in_order

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.base import LayerFactory


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm. `run_layers(layers, x, rope, backend, fb)`
    is what runs the layers: `run_in_order` until the weights are loaded, then the one
    `layers.layer_runner` picks for the final layers (`process_weights_after_loading`)."""

    def __init__(self, config, qkv_bias: bool, o_bias: bool, layers: LayerFactory):
        super().__init__()
        self.run_layers = run_in_order
        self._layer_runner = layers.layer_runner
        self.embed_tokens = layers.embedding(config.vocab_size, config.hidden_size)
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
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding's weight with the head when the config ties them; called at
        build time and again after a load that assigned new parameter objects."""
        if getattr(self.config, "tie_word_embeddings", False):
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
