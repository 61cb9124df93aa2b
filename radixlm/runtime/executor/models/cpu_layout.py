"""CPU weight layouts for a loaded causal LM: packed panels, or torch's input-major layout.

Decode steps multiply a few rows by every weight, so they stream the weights from memory.
MKL reads nn.Linear's [out, in] layout slowly for few rows and threads such small products
poorly. Two layouts, chosen once at load time by `use_cpu_layout`:

* **packed** (fp32, where `radixlm.kernels.cpu.CpuKernels` builds): each projection holds
  16-column panels [ceil(out / 16), in, 16] multiplied by the packed GEMM kernel; the head
  keeps its (possibly tied) weight and adds panels. Measured on the 2-core AVX2 CI
  machine (SmolLM2-135M, the 210 decoder projections, cold weights, ms per pass):

  | rows | 1 thread: MKL -> packed | 2 threads: MKL -> packed |
  |---|---|---|
  | 1 | 33.8 -> 37.0 | 29.0 -> 19.4 |
  | 4 | 57.3 -> 31.2 | 63.1 -> 22.5 |
  | 16 | 91.7 -> 61.3 | 95.8 -> 40.5 |
  | 64 | 265.6 -> 267.7 | 213.9 -> 169.2 |
  | 512 | 1959 -> 2311 | 1112 -> 1233 |

  The head (49152 x 576) at 16 rows, 2 threads: 27.1 -> 10.8 ms. Prefill-sized products
  (hundreds of rows) cost about 10-20% more than MKL; the projections keep no second copy.
  With the packed layout the decoder's other small ops move to C kernels too: q/k/v and
  gate/up are fused into one packed product each (`PackedAttention`, `PackedMLP`), RoPE
  runs in place on the fused q/k, SwiGLU's silu(gate) * up and RMSNorm are single calls
  (`CpuRMSNorm`). Each replaces several torch ops whose per-call overhead dominates at
  decode sizes (RMSNorm on one row, 2 threads: 81 us as torch ops).
  With `GgufPanels` (a .gguf model, `--weight-format gguf`) the projections whose GGUF
  tensors are Q4_1 or Q8_0 blocks keep them as quantized panels (`QuantLinear`, 0.625 or
  1.0625 bytes per weight instead of 4; the head too): the same weight values, products
  equal bit for bit to the fp32 panels', and a decode step streams a sixth of the bytes.
* **input-major** (the fallback: other dtypes, or no compiler/AVX2): projections store
  W^T [in, out] for `torch.mm`; the head adds a W^T copy used for at most `FEW_ROWS` rows.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import ForwardMode
from radixlm.kernels.cpu import CpuKernels, LayerSpec, into_huge_pages
from radixlm.kernels.cpu_native import CpuNativeBackend
from radixlm.runtime.executor.models.cpu_linear import (
    FloatPanels,
    PackedHead,
    PackedLinear,
    QuantLinear,
)
from radixlm.runtime.executor.models.llama import (
    MLP,
    Attention,
    DecoderLayer,
    LlamaModel,
    RMSNorm,
    run_in_order,
)

logger = logging.getLogger(__name__)

#: Rows up to which the input-major head uses its transposed copy (MKL, 1 thread: 1 row
#: 8.6 -> 4.8 ms, 3 rows 30.9 -> 14.3 ms, but 4 rows 21 -> 28 ms).
FEW_ROWS = 3


class PackedAttention(nn.Module):
    """`models.llama.Attention` with q/k/v fused into one `PackedLinear` and RoPE applied in
    place by the C kernel. Same forward signature and result."""

    def __init__(self, attn: Attention, kernels: CpuKernels, source=None, name: str = ""):
        super().__init__()
        source = source or FloatPanels()
        self.layer_id = attn.layer_id
        self.num_heads, self.num_kv_heads = attn.num_heads, attn.num_kv_heads
        self.head_dim = attn.head_dim
        parts = [attn.q_proj, attn.k_proj, attn.v_proj]
        names = [f"{name}.{p}_proj" for p in "qkv"]
        self.qkv_proj = source.linear(names, parts, kernels)
        self.o_proj = source.linear([f"{name}.o_proj"], [attn.o_proj], kernels)
        self._kernels = kernels

    def forward(self, x, rope, backend, fb):
        t, h, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [t, (h + 2 hkv) d]
        self._kernels.rope_(qkv, h + hkv, d, *rope)
        q = qkv[:, : h * d].view(t, h, d)
        k = qkv[:, h * d : (h + hkv) * d].view(t, hkv, d)
        v = qkv[:, (h + hkv) * d :].view(t, hkv, d)
        o = backend.forward(q, k, v, self.layer_id, fb)
        return self.o_proj(o.reshape(t, h * d))


class PackedMLP(nn.Module):
    """`models.llama.MLP` with gate/up fused into one `PackedLinear` and silu(gate) * up
    in one C call."""

    def __init__(self, mlp: MLP, kernels: CpuKernels, source=None, name: str = ""):
        super().__init__()
        source = source or FloatPanels()
        names = [f"{name}.gate_proj", f"{name}.up_proj"]
        self.gate_up_proj = source.linear(names, [mlp.gate_proj, mlp.up_proj], kernels)
        self.down_proj = source.linear([f"{name}.down_proj"], [mlp.down_proj], kernels)
        self._kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self._kernels.silu_mul(self.gate_up_proj(x)))


class CpuRMSNorm(nn.Module):
    """`models.llama.RMSNorm` (same `weight`, `eps`) as one C call; fp32 [rows, dim]."""

    def __init__(self, norm: RMSNorm, kernels: CpuKernels):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps
        self._kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernels.rms_norm(x, self.weight, self.eps)


class CpuDecoderLayer(nn.Module):
    """`models.llama.DecoderLayer` with packed attention and MLP; forward calls the modules
    as the original does. `spec` (sizes) and `weights()` describe the layer to the C decode
    stack (`FusedDecodeStack`), which takes it when `fused_decode` (head shapes it
    supports)."""

    def __init__(self, layer: DecoderLayer, kernels: CpuKernels, source=None, name: str = ""):
        super().__init__()
        self.self_attn = PackedAttention(layer.self_attn, kernels, source, f"{name}.self_attn")
        self.mlp = PackedMLP(layer.mlp, kernels, source, f"{name}.mlp")
        self.input_layernorm = CpuRMSNorm(layer.input_layernorm, kernels)
        self.post_attention_layernorm = CpuRMSNorm(layer.post_attention_layernorm, kernels)
        self._kernels = kernels
        attn, mlp = self.self_attn, self.mlp
        if self.post_attention_layernorm.eps != self.input_layernorm.eps:
            raise ValueError("the fused CPU layer needs one RMSNorm eps for both norms")
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
        #: The C layer needs whole 8-float vectors per head and whole query groups, and
        #: has no output-projection bias (Llama's attention_bias).
        self.fused_decode = (
            attn.head_dim % 8 == 0
            and attn.num_heads % attn.num_kv_heads == 0
            and attn.o_proj.bias is None
        )

    def weights(self) -> tuple[torch.Tensor | None, ...]:
        """The tensors `spec` points at, in LayerSpec's pointer order: ln1, ln2, qkv panels,
        qkv bias (or None), o, gate_up and down panels."""
        attn, mlp = self.self_attn, self.mlp
        return (
            self.input_layernorm.weight, self.post_attention_layernorm.weight,
            attn.qkv_proj.panels, attn.qkv_proj.bias, attn.o_proj.panels,
            mlp.gate_up_proj.panels, mlp.down_proj.panels,
        )  # fmt: skip

    def forward(self, x, rope, backend, fb):
        x = x + self.self_attn(self.input_layernorm(x), rope, backend, fb)
        return x + self.mlp(self.post_attention_layernorm(x))


class FusedDecodeStack:
    """`LlamaModel.run_layers` for the packed layout: a decode step on the `cpu` attention
    backend runs every decoder layer in one C call (`CpuKernels.decode_layers`, updating x
    float32 [T, hidden] in place), and so does every causal extend or chain-draft verify
    step when the backend runs the C extend kernel (with the decode attention kernel when
    every request has one new token); other steps (draft trees with branches, no C
    extend kernel) run the layers in order (`run_in_order`).
    One call runs the same kernels the layer modules would, without a dozen Python calls
    per layer: a tenth of a short step (a 33-token turn extend, a 5-token verify), and
    still 4-9% of prefills of 128-2048 tokens (2 threads, Zen 4). Its scratch holds
    T * (2 hidden + qkv + H D + 3 inter) floats, 29 KB per new token for SmolLM2-135M.
    It holds each layer's weight tensors (`CpuDecoderLayer.weights()`) from construction
    and re-reads their addresses every step: a `.data` move is followed, a parameter
    object replaced afterwards is not (build a new stack then).

    Raises ValueError when the layers are not all fused-capable `CpuDecoderLayer`s of one
    size (use `run_in_order` for those).
    """

    def __init__(self, layers: nn.ModuleList, kernels: CpuKernels):
        if not fusable(layers):
            raise ValueError("FusedDecodeStack needs fused-capable CpuDecoderLayers of one size")
        self._kernels = kernels
        self._specs = (LayerSpec * len(layers))(*(layer.spec for layer in layers))
        #: Each layer's weight tensors, held here: looking them up through the modules
        #: every step cost 5% of a batch-1 step.
        self._weights = [layer.weights() for layer in layers]

    def __call__(self, layers, x, rope, backend, fb):
        if not isinstance(backend, CpuNativeBackend):
            return run_in_order(layers, x, rope, backend, fb)
        if fb.mode is ForwardMode.DECODE:
            ext_lens = None
        elif backend.extend_kernel and _causal(fb):
            ext_lens = backend.extend_lens()
            if x.shape[0] == ext_lens.shape[0]:  # one new token each: decode attention
                ext_lens = None
        else:
            return run_in_order(layers, x, rope, backend, fb)
        # Addresses are re-read every step (0.25 us each), so a parameter whose `.data`
        # moved can never leave C a stale pointer.
        for spec, w in zip(self._specs, self._weights):  # spec: a view into the array
            spec.ln1, spec.ln2, spec.qkv = w[0].data_ptr(), w[1].data_ptr(), w[2].data_ptr()
            spec.qkv_bias = None if w[3] is None else w[3].data_ptr()
            spec.o, spec.gate_up, spec.down = w[4].data_ptr(), w[5].data_ptr(), w[6].data_ptr()
            spec.scale = backend.scaling
        pool = backend.kv_pool
        x = x.contiguous()
        self._kernels.decode_layers(
            self._specs, x, rope[0], rope[1], pool.k_buffer, pool.v_buffer, fb.out_cache_loc,
            *backend.decode_tables(), ext_lens,
        )  # fmt: skip
        return x


def _causal(fb) -> bool:
    """Whether every new token of this EXTEND or TARGET_VERIFY step sees exactly its
    request's cached prefix and the new tokens up to itself: always for EXTEND (chain-draft
    verifies arrive as EXTEND too), and for a TARGET_VERIFY step whose masks are causal
    (a draft model's tree steps may be)."""
    if fb.mode is ForwardMode.EXTEND:
        return True
    if fb.mode is not ForwardMode.TARGET_VERIFY or fb.custom_mask is None:
        return False
    offset = 0
    for pre, n in zip(fb.extend_prefix_lens.tolist(), fb.extend_seq_lens.tolist()):
        mask = fb.custom_mask[offset : offset + n * (pre + n)].view(n, pre + n)
        offset += n * (pre + n)
        chain = torch.ones(n, n, dtype=torch.bool).tril_()
        if not (bool(mask[:, :pre].all()) and torch.equal(mask[:, pre:], chain)):
            return False
    return True


def fusable(layers) -> bool:
    """Whether `FusedDecodeStack` takes these layers: one or more fused-capable
    `CpuDecoderLayer`s, all of one size (hidden, inter, heads, kv_heads, head_dim, eps)."""
    if not layers or not all(isinstance(la, CpuDecoderLayer) and la.fused_decode for la in layers):
        return False
    fields = ("hidden", "inter", "heads", "kv_heads", "head_dim", "eps")
    return len({tuple(getattr(la.spec, f) for f in fields) for la in layers}) == 1


class InputMajorLinear(nn.Module):
    """A linear layer holding `weight_t` [in, out] contiguous (and `bias` [out] or None).

    forward(x [rows, in]) -> [rows, out] in x's dtype (`torch.mm` / `torch.addmm`).
    """

    extra_bytes = 0

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)


class FewRowsHead(nn.Module):
    """lm_head holding both layouts: `weight` [vocab, hidden] (the original parameter,
    possibly tied to the embedding) and a contiguous `weight_t` [hidden, vocab] copy.

    forward(x [rows, hidden]) -> logits [rows, vocab] in x's dtype; `x @ weight_t` for at
    most `FEW_ROWS` rows, `F.linear(x, weight)` above.
    """

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias
        self.register_buffer("weight_t", head.weight.detach().t().contiguous(), persistent=False)

    @property
    def extra_bytes(self) -> int:
        """Bytes of the transposed copy (vocab * hidden * element size)."""
        return self.weight_t.numel() * self.weight_t.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > FEW_ROWS:
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def _packed(child: nn.Module, kernels: CpuKernels, source, name: str) -> nn.Module | None:
    """The packed-layout replacement of one module (named `name`), or None to recurse
    into it."""
    if isinstance(child, DecoderLayer):
        return CpuDecoderLayer(child, kernels, source, name)
    if isinstance(child, Attention):
        return PackedAttention(child, kernels, source, name)
    if isinstance(child, MLP):
        return PackedMLP(child, kernels, source, name)
    if isinstance(child, RMSNorm):
        return CpuRMSNorm(child, kernels)
    if isinstance(child, nn.Linear):
        return source.linear([name], [child], kernels)
    return None


def _fuse_decode_stack(inner: nn.Module, kernels: CpuKernels) -> None:
    """Install `FusedDecodeStack` as a LlamaModel's `run_layers` where its layers allow."""
    if isinstance(inner, LlamaModel) and fusable(inner.layers):
        inner.run_layers = FusedDecodeStack(inner.layers, kernels)


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


def use_cpu_layout(
    model: nn.Module,
    kernels: CpuKernels | None,
    source: FloatPanels | None = None,
    lm_head_screen: bool = True,
) -> int:
    """Convert a loaded causal LM in place. With `kernels` and fp32 weights: attention, MLP,
    RMSNorm and every other nn.Linear under `model.model` take their packed / C-kernel
    forms and `model.lm_head` becomes a `PackedHead`, each projection packed by `source`
    (default `FloatPanels`; `GgufPanels` keeps GGUF blocks quantized), and with
    `lm_head_screen` an fp32 head gets its greedy screen (`PackedHead.attach_screen`);
    otherwise every nn.Linear takes the input-major layout and the head a `FewRowsHead`.
    Returns the bytes added (the head's second layout and screen, plus any fp32 panel
    padding); the originals are
    released (`quantized_savings` gives what quantized panels save over them)."""
    packed = kernels is not None and model.lm_head.weight.dtype == torch.float32
    source = source or FloatPanels()

    def convert(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            full = f"{prefix}.{name}"
            if packed:
                new = _packed(child, kernels, source, full)
            else:
                new = InputMajorLinear(child) if isinstance(child, nn.Linear) else None
            if new is None:
                convert(child, full)
            else:
                setattr(parent, name, new)

    convert(model.model, "model")
    model.lm_head = source.head(model.lm_head, kernels) if packed else FewRowsHead(model.lm_head)
    if packed:
        if lm_head_screen:
            model.lm_head.attach_screen()
        _panels_into_huge_pages(model)
        _fuse_decode_stack(model.model, kernels)
    linears = (m for m in model.model.modules() if isinstance(m, (PackedLinear, InputMajorLinear)))
    return sum(m.extra_bytes for m in linears) + model.lm_head.extra_bytes


def quantized_savings(model: nn.Module) -> int:
    """Bytes the model's `QuantLinear` panels save over the fp32 weights they replaced."""
    return sum(m.saved_bytes for m in model.modules() if isinstance(m, QuantLinear))
