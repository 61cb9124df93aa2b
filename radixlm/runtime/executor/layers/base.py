"""The layer factory a model asks for its implementations when it is built.

A model (`models/decoder.py`'s `CausalLM`) never constructs a projection, norm,
attention, MLP, mixture of experts, decoder layer or head itself: it asks its
`LayerFactory`, and asks it what runs the stack of decoder layers. One factory per way of
computing (plain torch; torch with Triton MoE on CUDA; packed CPU panels and C kernels;
torch's input-major CPU layout). A new way (tensor-parallel linears, other weight
formats) is a new factory class, or a new panel source behind `PackedCpuLayers`.

Loading: every module the factory builds holds its weights under the Hugging Face
checkpoint's names (q_proj, k_proj, gate_proj, lm_head ...), so a HF state dict loads
with no renaming (`executor/weights.py`). A module whose final storage differs (q/k/v
fused into one product, packed panels, transposed copies) takes it in its own
`process_weights_after_loading()` (as in vLLM), which `LayerFactory.process_weights_
after_loading(model)` calls once after the weights are loaded, descendants before their
ancestors; the module tree keeps its modules.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch
from torch import nn

from radixlm.runtime.executor.layers.blocks import (
    MLP,
    Attention,
    AttentionOptions,
    DecoderLayer,
    RMSNorm,
    run_in_order,
)
from radixlm.runtime.executor.layers.moe import MoEOptions, SparseMoeBlock
from radixlm.runtime.executor.layers.moe_experts import ExpertsImpl, TorchExperts, TritonExperts

#: run_layers(layers, x, rope, backend, fb) -> x: what runs a model's decoder layers.
LayerRunner = Callable[..., torch.Tensor]


class LayerFactory(abc.ABC):
    """Builds a model's layers. Subclasses give `linear` and `lm_head`; the default
    attention, MLP, norm and decoder layer are the torch ones of `layers.blocks` built on
    those projections, run in order.

    Module names passed in (`name`, `prefix`) are the HF module names, e.g.
    "model.layers.0.self_attn.q_proj"; factories that keep per-weight data (GGUF blocks)
    look them up by it.
    """

    #: server_info's `cpu_layout`: "packed", "input-major", or None (not a CPU layout).
    cpu_layout: str | None = None
    #: The packed layout's weight format ("fp32" or "gguf"); None elsewhere.
    weight_format: str | None = None

    @property
    def quantized_weights(self) -> int:
        """Projections kept as quantized panels (known after loading)."""
        return 0

    @abc.abstractmethod
    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        """A projection x [rows, in] -> [rows, out] holding `weight` [out, in] (and `bias`
        [out]) until loaded."""

    @abc.abstractmethod
    def lm_head(self, hidden: int, vocab: int, bias: bool = False) -> nn.Module:
        """The output head x [rows, hidden] -> logits [rows, vocab], holding `weight`
        [vocab, hidden] (which a tied model replaces by the embedding's)."""

    def embedding(self, vocab: int, hidden: int) -> nn.Module:
        """The token embedding: int64 ids [T] -> [T, hidden], holding `weight` [vocab, hidden]."""
        return nn.Embedding(vocab, hidden)

    def rms_norm(self, dim: int, eps: float, unit_offset: bool = False) -> nn.Module:
        """RMSNorm over the last dimension, holding `weight` [dim] (scale 1 + weight with
        `unit_offset`, Gemma's)."""
        return RMSNorm(dim, eps, unit_offset)

    def attention(self, config, layer_id: int, opts: AttentionOptions, prefix: str) -> nn.Module:
        """GQA self-attention with RoPE (`blocks.Attention`'s forward signature and
        num_heads, num_kv_heads, head_dim, layer_id, sliding_window, scaling attributes)."""
        return Attention(config, layer_id, opts, self, prefix)

    def mlp(self, hidden: int, intermediate: int, prefix: str, activation: str = "silu"):
        """The gated feed-forward block (`blocks.MLP`; SwiGLU or GeGLU)."""
        return MLP(hidden, intermediate, self, prefix, activation)

    def decoder_layer(
        self,
        config,
        layer_id: int,
        opts: AttentionOptions,
        prefix: str,
        mlp: nn.Module | None = None,
    ) -> nn.Module:
        """One pre-norm decoder block (`blocks.DecoderLayer`); `mlp` replaces the dense
        feed-forward block (a mixture of experts)."""
        return DecoderLayer(config, layer_id, opts, self, prefix, mlp)

    def head_range(self, num_heads: int) -> tuple[int, int]:
        """(first, count): the attention heads [first, first + count) of the model's
        `num_heads` this factory's modules compute; all of them unless the model is split
        by tensor parallelism."""
        return 0, num_heads

    def experts(self) -> ExpertsImpl:
        """How mixture-of-experts blocks hold and run their experts: plain torch, stacked,
        by default."""
        return TorchExperts()

    def moe(self, opts: MoEOptions, prefix: str) -> nn.Module:
        """A sparse mixture-of-experts feed-forward block (`layers.moe.SparseMoeBlock`)
        named `prefix` ("model.layers.i.mlp"), its experts from `experts()`."""
        return SparseMoeBlock(opts, self.experts(), prefix)

    def layer_runner(self, layers: nn.ModuleList) -> LayerRunner:
        """What runs these (loaded, final) layers each step: in order by default."""
        return run_in_order

    def process_weights_after_loading(self, model: nn.Module) -> None:
        """Give every module of the loaded `model` its final storage: each module's own
        `process_weights_after_loading()`, descendants first."""
        for module in reversed(list(model.modules())):
            hook = getattr(module, "process_weights_after_loading", None)
            if hook is not None:
                hook()

    def copy_bytes(self, model: nn.Module) -> int:
        """Bytes the final layout holds beyond the checkpoint's weights (second layouts of
        the head, panel padding: each module's `extra_bytes`)."""
        return sum(getattr(m, "extra_bytes", 0) for m in model.modules())

    def saved_bytes(self, model: nn.Module) -> int:
        """Bytes fewer than the checkpoint's weights that quantized storage holds (each
        module's `saved_bytes`)."""
        return sum(getattr(m, "saved_bytes", 0) for m in model.modules())


class TorchLayers(LayerFactory):
    """Plain torch modules (nn.Linear, `layers.blocks`), run in order: the reference
    implementation. Nothing to do after loading."""

    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return nn.Linear(in_features, out_features, bias=bias)

    def lm_head(self, hidden: int, vocab: int, bias: bool = False) -> nn.Module:
        return nn.Linear(hidden, vocab, bias=bias)


class CudaLayers(TorchLayers):
    """The CUDA path: plain torch modules, with mixture-of-experts blocks run by the Triton
    fused-MoE kernel (`TritonExperts`) and, for a quantized checkpoint (`quantized`: its
    `executor.quant.load_quantized` weights by module name), its linears swapped after
    loading for `QuantizedLinear` (Triton W4A16 / W8A8 kernels)."""

    def __init__(self, quantized: dict | None = None):
        self.quantized = quantized or {}

    @property
    def quantized_weights(self) -> int:
        return len(self.quantized)

    def process_weights_after_loading(self, model: nn.Module) -> None:
        super().process_weights_after_loading(model)
        if self.quantized:
            from radixlm.runtime.executor.layers.quant_linear import swap_quantized

            swap_quantized(model, self.quantized)

    def experts(self) -> ExpertsImpl:
        return TritonExperts()
