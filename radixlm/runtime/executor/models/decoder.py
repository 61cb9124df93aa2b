"""The decoder-only causal LM every family shares: token embedding, a stack of decoder
layers, the final norm and the output head, run over a `ForwardBatch`.

A family is a subclass of `CausalLM` that says how its config maps onto the shared blocks
(`runtime/executor/layers/blocks.py`): the attention options of each layer, the
feed-forward block of each layer (dense or a mixture of experts), its own decoder layer
class where the block order differs (Gemma 3), how its checkpoint's tensor names map onto
the modules (`adapt_checkpoint`), and which config fields it refuses (`check_config`).
Every module comes from the `LayerFactory` the model is built with; attention goes through
the `AttentionBackend` the caller passes, and the model never branches on it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.errors import UnsupportedModelError
from radixlm.kernels import AttentionBackend, ForwardBatch, ForwardMode
from radixlm.runtime.executor.layers.blocks import AttentionOptions, RotaryEmbedding, run_in_order
from radixlm.runtime.executor.memory import KVPool, kv_bytes_per_token

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.base import LayerFactory


class DecoderModel(nn.Module):
    """Embedding, decoder layers, final norm and RoPE tables; the layers come from
    `lm.build_layer`. `run_layers(layers, x, rope, backend, fb)` is what runs the layers:
    `run_in_order` until the weights are loaded, then the one `layers.layer_runner` picks
    for the final layers (`process_weights_after_loading`)."""

    def __init__(self, config, lm: CausalLM, layers: LayerFactory):
        super().__init__()
        self.run_layers = run_in_order
        self._layer_runner = layers.layer_runner
        self.embed_tokens = layers.embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            lm.build_layer(config, i, layers, f"model.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = layers.rms_norm(config.hidden_size, config.rms_norm_eps, lm.unit_offset_norm)
        self.rotary_emb = lm.rotary_embedding(config)

    def process_weights_after_loading(self) -> None:
        """Pick the layer runner once the layers hold their final weights (the loader calls
        this after every layer's own post-load step)."""
        self.run_layers = self._layer_runner(self.layers)


class CausalLM(nn.Module):
    """Causal LM over a `ForwardBatch`; returns fp32 logits of each request's last token.

    Args:
        config: the family's transformers config.
        layers: the `LayerFactory` every block and the head come from.
    Raises UnsupportedModelError naming the field for a config value the family does not
    implement (`check_config`).

    Subclasses set the class attributes and override the hooks below; the defaults are
    Llama's.
    """

    #: Whether the config's `attention_bias` biases q/k/v (and o, `o_bias_with_attention_bias`),
    #: and the q/k/v bias when the config has no such field.
    qkv_bias_default = False
    o_bias_with_attention_bias = True
    #: Gemma's norms scale by (1 + weight).
    unit_offset_norm = False
    #: Multiply the embedding output by sqrt(hidden) in the model dtype (Gemma).
    scale_embedding = False
    #: When True, `forward` keeps the normed last hidden states of every new token
    #: (float [T, hidden]) in `last_hidden` (EAGLE drafting reads them).
    capture_hidden = False
    #: Name suffixes of tensors loaded in float32 whatever the model dtype (routers whose
    #: choices are sensitive to rounding, as transformers keeps them).
    fp32_tensors: tuple[str, ...] = ()
    last_hidden: torch.Tensor | None = None

    def __init__(self, config, layers: LayerFactory):
        super().__init__()
        self.check_config(config)
        self.config = config
        self.model = DecoderModel(config, self, layers)
        self.lm_head = layers.lm_head(config.hidden_size, config.vocab_size)
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.embed_scale = math.sqrt(config.hidden_size) if self.scale_embedding else None
        self.tie_weights()

    # -- family hooks ---------------------------------------------------------------

    @classmethod
    def check_config(cls, config) -> None:
        """Raise UnsupportedModelError naming a config field this family does not
        implement (default: none beyond what the blocks check)."""

    @classmethod
    def adapt_checkpoint(cls, state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors under this model's parameter names (default: the
        names already match). Raises WeightsMismatchError naming a tensor that cannot be
        mapped (wrong shape for a split)."""
        return state

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        """The checkpoint tensor that parameter `name` is loaded from through
        `adapt_checkpoint` (default: the same name); load errors name tensors by it."""
        return name

    def attention_options(self, config, layer_id: int) -> AttentionOptions:
        """How layer `layer_id` attends (biases, q/k norm, window, scale)."""
        qkv_bias = getattr(config, "attention_bias", self.qkv_bias_default)
        o_bias = self.o_bias_with_attention_bias and bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bool(qkv_bias), o_bias=o_bias)

    def feed_forward(self, config, layer_id: int, layers: LayerFactory, prefix: str):
        """The feed-forward block of layer `layer_id` named `prefix` ("model.layers.i.mlp"),
        or None for the factory's dense gated MLP."""
        return None

    def build_layer(self, config, layer_id: int, layers: LayerFactory, prefix: str) -> nn.Module:
        """Decoder layer `layer_id` (the factory's pre-norm block by default)."""
        opts = self.attention_options(config, layer_id)
        mlp = self.feed_forward(config, layer_id, layers, f"{prefix}.mlp")
        return layers.decoder_layer(config, layer_id, opts, prefix, mlp)

    def rotary_embedding(self, config) -> nn.Module:
        """The module giving each step's RoPE tables (called with positions, dtype)."""
        return RotaryEmbedding(config)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """KV cache bytes per token in `dtype` (every layer), as `create_kv_pool` stores
        them: per-head K and V of layer 0's attention shape by default."""
        attn = self.model.layers[0].self_attn
        layers = self.config.num_hidden_layers
        return kv_bytes_per_token(layers, attn.num_kv_heads, attn.head_dim, dtype)

    def create_kv_pool(
        self, num_slots: int, dtype: torch.dtype, device, padding_slots: int
    ) -> KVPool:
        """The KV pool of `num_slots` slots this model's attention writes and reads (a
        `KVPool` of layer 0's attention shape by default; `padding_slots` leading slots
        zeroed)."""
        attn = self.model.layers[0].self_attn
        return KVPool(
            num_slots,
            self.config.num_hidden_layers,
            attn.num_kv_heads,
            attn.head_dim,
            dtype,
            device,
            padding_slots=padding_slots,
        )

    # -------------------------------------------------------------------------------

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
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
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
        """The head over final states x [R, hidden]: float32 [R, vocab], soft-capped as
        cap * tanh(logits / cap) where the config sets `final_logit_softcapping`. An
        argmax-only batch takes the head's `argmax_logits` where it has one (`PackedHead`)."""
        head = getattr(self.lm_head, "argmax_logits", None) if fb.argmax_only else None
        logits = (head or self.lm_head)(x).float()
        cap = self.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


def layer_type_window(config, layer_id: int) -> int | None:
    """The sliding window of layer `layer_id` where the config lists `layer_types` (Qwen2,
    Qwen3, Qwen2-MoE: "sliding_attention" from `max_window_layers` on when
    `use_sliding_window`): `sliding_window` for a sliding layer, else None."""
    types = getattr(config, "layer_types", None)
    if types and types[layer_id] == "sliding_attention":
        return config.sliding_window
    return None


def refuse(field: str, value, supported: str) -> UnsupportedModelError:
    """The error for a config field value a family does not implement."""
    return UnsupportedModelError(f"config field {field}={value!r} is not supported ({supported})")
