"""The packed CPU layout: fp32 packed panels (or quantized GGUF panels) and radixlm's C
kernels (`radixlm.kernels.cpu`), where the kernels build and the weights are fp32.

Decode steps multiply a few rows by every weight, so they stream the weights from memory;
MKL reads nn.Linear's [out, in] layout slowly for few rows and threads such small products
poorly. Here each projection holds 16-column panels [ceil(out / 16), in, 16] multiplied by
the packed GEMM kernel (prefill-sized products cost a little more than MKL; no second copy
is kept). q/k/v and gate/up are fused into one product each (`PackedAttention`,
`PackedMLP`), RoPE runs in place on the fused q/k, SwiGLU's silu(gate) * up and RMSNorm
are single C calls (`CpuRMSNorm`): each replaces several torch ops whose per-call overhead
dominates at decode sizes. The head keeps its (possibly tied) weight and adds panels
(`PackedHead`). With `GgufPanels` (`--weight-format gguf`) projections whose GGUF tensors
are Q4_1 or Q8_0 blocks keep them as quantized panels: the same weight values, products
equal bit for bit to the fp32 panels'. Timings: see docs/perf-notes.md.

Every module loads the checkpoint's weights under their HF names (nn.Linear holders for
q_proj, k_proj, ...) and packs them in its own `process_weights_after_loading`.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.kernels.cpu import CpuKernels, LayerSpec, into_huge_pages
from radixlm.runtime.executor.layers.base import LayerFactory, LayerRunner, TorchLayers
from radixlm.runtime.executor.layers.blocks import (
    ACTIVATIONS,
    MLP,
    Attention,
    AttentionOptions,
    DecoderLayer,
    RMSNorm,
    apply_rotary,
    run_in_order,
)
from radixlm.runtime.executor.layers.cpu_linear import (
    FloatPanels,
    PackedHead,
    PackedLinear,
    QuantLinear,
)
from radixlm.runtime.executor.layers.fused_stack import FusedDecodeStack, fusable
from radixlm.runtime.executor.layers.moe_experts import ExpertsImpl, grouped_by_expert


class PackedAttention(Attention):
    """`blocks.Attention` with q/k/v fused into one packed product (`qkv_proj`) and
    RoPE applied in place by the C kernel (by torch for a partial rotation, after the q/k
    norms where the family has them). Same forward signature and result.

    Loads `q_proj`, `k_proj`, `v_proj`, `o_proj` (nn.Linear holders named as in the
    checkpoint); `process_weights_after_loading` replaces them by `qkv_proj` and `o_proj`
    from the panel `source`.
    """

    def __init__(
        self,
        config,
        layer_id: int,
        opts: AttentionOptions,
        kernels: CpuKernels,
        source: FloatPanels,
        prefix: str,
    ):
        # nn.Linear holders under the checkpoint's names, packed after loading; C norms.
        super().__init__(config, layer_id, opts, _HolderLayers(kernels), prefix)
        self._kernels, self._source, self._prefix = kernels, source, prefix

    def process_weights_after_loading(self) -> None:
        names = [f"{self._prefix}.{p}_proj" for p in "qkv"]
        parts = [self.q_proj, self.k_proj, self.v_proj]
        self.qkv_proj = self._source.linear(names, parts, self._kernels)
        self.o_proj = self._source.linear([f"{self._prefix}.o_proj"], [self.o_proj], self._kernels)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, rope, backend, fb):
        t, h, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [t, (h + 2 hkv) d]
        v = qkv[:, (h + hkv) * d :].view(t, hkv, d)
        if self.q_norm is None and self.rotary_dim == d:
            self._kernels.rope_(qkv, h + hkv, d, *rope)
            q = qkv[:, : h * d].view(t, h, d)
            k = qkv[:, h * d : (h + hkv) * d].view(t, hkv, d)
        else:
            q = qkv[:, : h * d].reshape(t * h, d)
            k = qkv[:, h * d : (h + hkv) * d].reshape(t * hkv, d)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q = apply_rotary(q.view(t, h, d), *rope)
            k = apply_rotary(k.view(t, hkv, d), *rope)
            # k is a new tensor now; the C KV store takes k and v of one row stride.
            v = v.contiguous()
        o = backend.forward(q, k, v, self.layer_id, fb)
        return self.o_proj(o.reshape(t, h * d))


class PackedMLP(MLP):
    """`blocks.MLP` with gate/up fused into one packed product (`gate_up_proj`) and
    silu(gate) * up in one C call (other activations by torch). Loads `gate_proj`,
    `up_proj`, `down_proj` (nn.Linear holders); `process_weights_after_loading` packs them."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        kernels: CpuKernels,
        source: FloatPanels,
        prefix: str,
        activation: str = "silu",
    ):
        super().__init__(hidden, intermediate, TorchLayers(), prefix, activation)
        self._kernels, self._source, self._prefix = kernels, source, prefix

    def process_weights_after_loading(self) -> None:
        names = [f"{self._prefix}.gate_proj", f"{self._prefix}.up_proj"]
        self.gate_up_proj = self._source.linear(
            names, [self.gate_proj, self.up_proj], self._kernels
        )
        name = f"{self._prefix}.down_proj"
        self.down_proj = self._source.linear([name], [self.down_proj], self._kernels)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.activation == "silu":
            return self.down_proj(self._kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(ACTIVATIONS[self.activation](gate) * up)


class PackedProjection(nn.Module):
    """A single projection named `name` outside attention and MLP: `weight` [out, in] (and
    `bias`) as in the checkpoint until loaded, then `proj`, the panel source's packed
    module (`PackedLinear` or `QuantLinear`). forward(x [rows, in] fp32) -> [rows, out]."""

    def __init__(
        self,
        name: str,
        in_features: int,
        out_features: int,
        bias: bool,
        kernels: CpuKernels,
        source: FloatPanels,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self._name, self._kernels, self._source = name, kernels, source

    def process_weights_after_loading(self) -> None:
        self.proj = self._source.linear([self._name], [self], self._kernels)
        del self.weight, self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class CpuRMSNorm(RMSNorm):
    """`blocks.RMSNorm` (same `weight`, `eps`, `unit_offset`) as one C call; fp32
    [rows, dim]."""

    def __init__(self, dim: int, eps: float, kernels: CpuKernels, unit_offset: bool = False):
        super().__init__(dim, eps, unit_offset)
        self._kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernels.rms_norm(x, self.weight, self.eps)


class CpuDecoderLayer(DecoderLayer):
    """`blocks.DecoderLayer` of packed attention, MLP and C norms; forward calls the
    modules as the original does. Once loaded, `spec` (sizes, formats) and `weights()`
    describe the layer to the C decode stack (`FusedDecodeStack`), which takes it when
    `fused_decode` (shapes it supports)."""

    #: Whether the C decode stack can run this layer (set once loaded).
    fused_decode = False
    spec: LayerSpec | None = None

    def process_weights_after_loading(self) -> None:
        """Decide whether the C decode stack can run this layer (its attention and MLP are
        packed before this runs) and, if so, describe it (`spec`)."""
        attn, mlp = self.self_attn, self.mlp
        # The C layer needs whole 8-float vectors per head and whole query groups, one
        # norm eps, a dense SwiGLU MLP; it has no output-projection bias (Llama's
        # attention_bias), q/k norm, sliding window, partial rotation or custom scale.
        self.fused_decode = (
            isinstance(attn, PackedAttention)
            and isinstance(mlp, PackedMLP)
            and attn.head_dim % 8 == 0
            and attn.num_heads % attn.num_kv_heads == 0
            and attn.o_proj.bias is None
            and attn.q_norm is None
            and attn.sliding_window is None
            and attn.scaling == attn.head_dim**-0.5
            and attn.rotary_dim == attn.head_dim
            and mlp.activation == "silu"
            and self.post_attention_layernorm.eps == self.input_layernorm.eps
        )
        if not self.fused_decode:
            return
        self.spec = LayerSpec(
            hidden=attn.o_proj.out_features,
            inter=mlp.down_proj.in_features,
            heads=attn.num_heads,
            kv_heads=attn.num_kv_heads,
            head_dim=attn.head_dim,
            qkv_fmt=attn.qkv_proj.fmt,
            o_fmt=attn.o_proj.fmt,
            gate_up_fmt=mlp.gate_up_proj.fmt,
            down_fmt=mlp.down_proj.fmt,
            eps=self.input_layernorm.eps,
        )  # fmt: skip

    def weights(self) -> tuple[torch.Tensor | None, ...]:
        """The tensors `spec` points at, in LayerSpec's pointer order: ln1, ln2, qkv panels,
        qkv bias (or None), o, gate_up and down panels."""
        attn, mlp = self.self_attn, self.mlp
        return (
            self.input_layernorm.weight, self.post_attention_layernorm.weight,
            attn.qkv_proj.panels, attn.qkv_proj.bias, attn.o_proj.panels,
            mlp.gate_up_proj.panels, mlp.down_proj.panels,
        )  # fmt: skip


class PackedExpertGroup(nn.Module):
    """Loaded `PackedMLP` experts (`experts`, fused gate_up and down panels) run over their
    grouped rows (`grouped_by_expert`); fp32 only."""

    def __init__(self, experts: list[nn.Module]):
        super().__init__()
        self.experts = nn.ModuleList(experts)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        experts = self.experts
        return grouped_by_expert(x, ids, weights, len(experts), lambda e, r: experts[e](r))


class PackedExperts(ExpertsImpl):
    """Each expert a `PackedMLP` of the packed CPU layout, packed by its own post-load step
    (run by `LayerFactory.process_weights_after_loading` before the block's).

    Args:
        kernels: the loaded `CpuKernels`.
        source: the panel source (`FloatPanels`, the default, or `GgufPanels`, which keeps
            an expert's GGUF blocks quantized where they hold exactly its weights).
    """

    name = "packed"

    def __init__(self, kernels: CpuKernels, source: FloatPanels | None = None):
        self.kernels = kernels
        self.source = source or FloatPanels()

    def expert(self, hidden, intermediate, prefix):
        return PackedMLP(hidden, intermediate, self.kernels, self.source, prefix)

    def build(self, experts):
        return PackedExpertGroup(experts)


class _HolderLayers(TorchLayers):
    """nn.Linear holders (packed by their owner after loading) and C norms: what
    `PackedAttention` is built of before it packs."""

    def __init__(self, kernels: CpuKernels):
        self.kernels = kernels

    def rms_norm(self, dim: int, eps: float, unit_offset: bool = False) -> nn.Module:
        return CpuRMSNorm(dim, eps, self.kernels, unit_offset)


class PackedCpuLayers(LayerFactory):
    """Packed panels and C kernels (see the module docstring).

    Args:
        kernels: the loaded `CpuKernels`.
        source: how projections are stored (`FloatPanels`, the default, or `GgufPanels`).
        lm_head_screen: whether an fp32 head gets its greedy screen
            (`PackedHead.attach_screen`).
    """

    cpu_layout = "packed"

    def __init__(
        self, kernels: CpuKernels, source: FloatPanels | None = None, lm_head_screen: bool = True
    ):
        self.kernels = kernels
        self.source = source or FloatPanels()
        self.lm_head_screen = lm_head_screen

    @property
    def weight_format(self) -> str:
        return self.source.format

    @property
    def quantized_weights(self) -> int:
        return self.source.quantized

    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return PackedProjection(name, in_features, out_features, bias, self.kernels, self.source)

    def lm_head(self, hidden: int, vocab: int, bias: bool = False) -> nn.Module:
        return PackedHead(hidden, vocab, bias, self.kernels, self.source, self.lm_head_screen)

    def rms_norm(self, dim: int, eps: float, unit_offset: bool = False) -> nn.Module:
        return CpuRMSNorm(dim, eps, self.kernels, unit_offset)

    def attention(self, config, layer_id: int, opts: AttentionOptions, prefix: str) -> nn.Module:
        return PackedAttention(config, layer_id, opts, self.kernels, self.source, prefix)

    def mlp(self, hidden: int, intermediate: int, prefix: str, activation: str = "silu"):
        return PackedMLP(hidden, intermediate, self.kernels, self.source, prefix, activation)

    def decoder_layer(
        self,
        config,
        layer_id: int,
        opts: AttentionOptions,
        prefix: str,
        mlp: nn.Module | None = None,
    ) -> nn.Module:
        return CpuDecoderLayer(config, layer_id, opts, self, prefix, mlp)

    def experts(self):
        """Experts as packed panels of this layout's source (`PackedExperts`)."""
        return PackedExperts(self.kernels, self.source)

    def layer_runner(self, layers: nn.ModuleList) -> LayerRunner:
        """`FusedDecodeStack` where the layers allow (`fusable`), else in order."""
        return FusedDecodeStack(layers, self.kernels) if fusable(layers) else run_in_order

    def process_weights_after_loading(self, model: nn.Module) -> None:
        """Pack every module, then move all panels into one huge-page mapping."""
        super().process_weights_after_loading(model)
        _panels_into_huge_pages(model)


def _panels_into_huge_pages(model: nn.Module) -> None:
    """Move every panel tensor of `model` (with the head screen's copy) into one huge-page
    mapping (`into_huge_pages`), kept alive as `model.panel_arena`."""
    owners = [m for m in model.modules() if isinstance(m, (PackedLinear, QuantLinear, PackedHead))]
    screens = [m.screen for m in owners if getattr(m, "screen", None) is not None]
    arena, copies = into_huge_pages([m.panels.data for m in owners] + [s.panels for s in screens])
    if arena is None:
        return
    for m, copy in zip(owners, copies):
        m.panels.data = copy
    for screen, copy in zip(screens, copies[len(owners) :]):
        screen.panels = copy
    model.panel_arena = arena
