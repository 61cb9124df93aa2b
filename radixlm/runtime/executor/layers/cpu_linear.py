"""The packed-panel linear layers of the packed CPU layout (`layers.packed`), and the
panel sources that choose their storage: `FloatPanels` packs fp32 panels, `GgufPanels`
keeps a GGUF file's Q4_1 / Q8_0 blocks as quantized panels (`kernels.cpu.quant`) wherever
they hold exactly the loaded fp32 weight, so products are bit for bit the fp32 panels'
while a decode step streams fewer bytes per weight; `CheckpointPanels` keeps a quantized
checkpoint's int4 / int8 / fp8 weights (`executor.quant`). A new weight format is a new
source.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu import CpuKernels, pack_panels, quant
from radixlm.runtime.executor.gguf_blocks import RawBlocks
from radixlm.runtime.executor.layers.head_screen import ArgmaxScreen
from radixlm.runtime.executor.quant import W4A16, W8A8_FP8, W8A8_INT8, QuantizedWeight

logger = logging.getLogger(__name__)

#: Rows up to which the packed head uses its panels (above: F.linear on the original
#: weight, faster for prefill-sized products; see docs/perf-notes.md).
PACKED_HEAD_ROWS = 256


class PackedLinear(nn.Module):
    """A linear layer holding only `panels` [ceil(out / 16), in, 16] fp32 (and `bias`).

    forward(x [rows, in] fp32) -> [rows, out] fp32 through the packed GEMM kernel.
    """

    fmt = quant.FP32

    def __init__(self, linear: nn.Linear, gemm: CpuKernels):
        super().__init__()
        self.out_features, self.in_features = linear.out_features, linear.in_features
        self.panels = nn.Parameter(pack_panels(linear.weight), requires_grad=False)
        self.bias = linear.bias
        self._gemm = gemm

    @property
    def extra_bytes(self) -> int:
        """Bytes beyond the original weight (the last panel's zero padding)."""
        return (self.panels.shape[0] * 16 - self.out_features) * self.panels.shape[1] * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._gemm.mm(x, self.panels, self.out_features)
        return y if self.bias is None else y.add_(self.bias)


class QuantLinear(nn.Module):
    """A linear layer holding quantized `panels` of format `fmt` (`kernels.cpu.quant`):
    uint8 [out / 16, in / 32, group bytes] (Q4_1, Q8_0, W4G, F8) or the flat I8 buffer,
    and `bias` [out] fp32 or None.

    forward(x [rows, in] fp32) -> [rows, out] fp32 through the quantized GEMM kernel.
    """

    extra_bytes = 0

    def __init__(
        self,
        fmt: int,
        panels: torch.Tensor,
        shape: tuple[int, int],
        bias: nn.Parameter | None,
        gemm: CpuKernels,
    ):
        super().__init__()
        self.fmt = fmt
        self.out_features, self.in_features = shape
        self.panels = nn.Parameter(panels, requires_grad=False)
        self.bias = bias
        self._gemm = gemm

    @property
    def saved_bytes(self) -> int:
        """Bytes fewer than the fp32 weight these panels replace."""
        return self.out_features * self.in_features * 4 - self.panels.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._gemm.qmm(x, self.panels, self.fmt, self.out_features)
        return y if self.bias is None else y.add_(self.bias)


class FloatPanels:
    """Packs every projection as fp32 panels (`PackedLinear`, `PackedHead`). Subclasses
    keep some projections quantized by overriding `panels`."""

    #: server_info's `weight_format` for this source.
    format = "fp32"

    def __init__(self):
        #: Projections kept as quantized panels.
        self.quantized = 0

    def panels(self, names: list[str], linears: list[nn.Linear]) -> tuple[int, torch.Tensor] | None:
        """(format, quantized panels) computing the loaded `linears` (named `names`) side
        by side, or None for fp32 panels."""
        return None

    def linear(self, names: list[str], linears: list[nn.Linear], kernels: CpuKernels):
        """The packed module computing the loaded `linears` (named `names`) side by side."""
        fused = _fuse(linears) if len(linears) > 1 else linears[0]
        packed = self.panels(names, linears)
        if packed is None:
            return PackedLinear(fused, kernels)
        self.quantized += 1
        shape = (fused.out_features, fused.in_features)
        return QuantLinear(packed[0], packed[1], shape, fused.bias, kernels)

    def head_panels(self, head: nn.Module) -> tuple[int, torch.Tensor] | None:
        """(format, quantized panels) for the loaded lm_head `head` (`weight`,
        `in_features`), or None for fp32 panels."""
        packed = self.panels(["lm_head"], [head])
        if packed is not None:
            self.quantized += 1
        return packed


class GgufPanels(FloatPanels):
    """Keeps a GGUF file's Q4_1 / Q8_0 blocks (`gguf_blocks.load_blocks`, keyed by module
    name) as quantized panels where every part of a projection has them in one format and
    they dequantize to exactly the loaded fp32 weight (checked at load); other projections
    get fp32 panels. `quantized` counts the projections kept quantized."""

    format = "gguf"

    def __init__(self, blocks: dict[str, RawBlocks]):
        super().__init__()
        self.blocks = blocks

    def panels(self, names, linears):
        parts = [self.blocks.get(name) for name in names]
        if any(p is None for p in parts) or len({(p.fmt, p.k) for p in parts}) != 1:
            return None
        fmt, k = parts[0].fmt, parts[0].k
        data = torch.cat([p.data for p in parts]) if len(parts) > 1 else parts[0].data
        if k != linears[0].in_features or data.shape[0] % 16 or k % 32:
            return None
        weight = torch.cat([lin.weight.detach() for lin in linears])
        if weight.dtype != torch.float32 or weight.shape[0] != data.shape[0]:
            return None
        if not torch.equal(quant.dequantize_blocks(data, fmt, k), weight):
            logger.warning("%s: GGUF blocks differ from the loaded weights; kept fp32", names)
            return None
        return fmt, quant.pack_blocks(data, fmt, k)


class CheckpointPanels(FloatPanels):
    """Keeps a quantized checkpoint's weights (`executor.quant.load_quantized`, keyed by
    module name) as quantized panels: W4A16 int4 groups as W4G panels (fp32 activations,
    products bit for bit the fp32 panels' of the dequantized weight), W8A8 int8 as the I8
    buffer (int8 activations quantized per token or statically, int32 dot products, bit for
    bit `quant_ref.w8a8_int8_ref`), W8A8 fp8 as F8 panels computed weight-only (fp32
    activations: CPUs have no fp8 arithmetic, and the weight holds the checkpoint's exact
    values). Parts of a fused projection must share a scheme (and group size, static
    activation scale); any other projection, or one whose dequantized values differ from
    the loaded weight, gets fp32 panels with a warning."""

    FORMATS = {W4A16: quant.W4G, W8A8_INT8: quant.I8, W8A8_FP8: quant.F8}

    def __init__(self, weights: dict[str, QuantizedWeight]):
        super().__init__()
        self.weights = weights
        self.format = "+".join(sorted({w.scheme for w in weights.values()})) or "fp32"

    def panels(self, names, linears):
        parts = [self.weights.get(name) for name in names]
        if all(p is None for p in parts):
            return None
        keys = {(p.scheme, p.group_size, _scalar(p.act_scale)) for p in parts if p is not None}
        weight = torch.cat([lin.weight.detach() for lin in linears])
        n, k = weight.shape
        if None in parts or len(keys) != 1 or n % 16 or k % 32:
            logger.warning("%s: quantized parts cannot share one kernel; kept fp32", names)
            return None
        deq = torch.cat([p.dequantize() for p in parts])
        if weight.dtype != torch.float32 or not torch.equal(deq, weight):
            logger.warning("%s: quantized weights differ from the loaded ones; kept fp32", names)
            return None
        first = parts[0]
        q = torch.cat([p.q for p in parts])
        scales = torch.cat([p.scales for p in parts])
        if first.scheme == W4A16:
            zeros = torch.cat([p.zeros for p in parts])
            return quant.W4G, quant.pack_w4(q, scales, zeros, first.group_size)
        if first.scheme == W8A8_INT8:
            return quant.I8, quant.pack_int8(q, scales, first.act_scale)
        return quant.F8, quant.pack_fp8(q, scales)


def _scalar(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(t)


def _fuse(linears: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the linears' outputs side by side."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=linears[0].bias is not None)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if fused.bias is not None:
        fused.bias = nn.Parameter(
            torch.cat([lin.bias.detach() for lin in linears]), requires_grad=False
        )
    return fused


class PackedHead(nn.Module):
    """lm_head holding `weight` [vocab, hidden] fp32 (possibly tied to the embedding) and,
    once loaded, `panels` of it (a buffer, never saved): fp32 panels, or the source's
    quantized ones (format `fmt`); packed GEMM for at most
    `PACKED_HEAD_ROWS` rows, `F.linear` above. forward(x [rows, hidden] fp32) -> logits
    [rows, vocab] fp32, after `process_weights_after_loading`.

    `argmax_logits` serves greedy-only batches: with an `ArgmaxScreen` attached
    (`attach_screen`; at load when `screen`), up to `screen.rows` rows read the head's
    half-size copy and compute exact logits only where the argmax can be.

    Args:
        hidden, vocab: the weight's shape [vocab, hidden]. bias: whether it has `bias`.
        gemm: the loaded `CpuKernels`. source: the panel source (default `FloatPanels`).
        screen: whether loading attaches the greedy screen.
    """

    def __init__(
        self,
        hidden: int,
        vocab: int,
        bias: bool,
        gemm: CpuKernels,
        source: FloatPanels | None = None,
        screen: bool = False,
    ):
        super().__init__()
        self.in_features, self.out_features = hidden, vocab
        self.weight = nn.Parameter(torch.empty(vocab, hidden), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(vocab), requires_grad=False) if bias else None
        self.register_buffer("panels", None, persistent=False)
        self.fmt: int | None = None
        self._gemm = gemm
        self._source = source or FloatPanels()
        self._attach = screen
        #: The greedy screen (`attach_screen`), or None.
        self.screen: ArgmaxScreen | None = None

    def process_weights_after_loading(self) -> None:
        """Pack the loaded weight (quantized where the source has its blocks) and attach
        the greedy screen when asked."""
        packed = self._source.head_panels(self)
        if packed is None:
            self.fmt, self.panels = quant.FP32, pack_panels(self.weight.detach())
        else:
            self.fmt, self.panels = packed
        if self._attach:
            self.attach_screen()

    def attach_screen(self) -> bool:
        """Build the head's `ArgmaxScreen` where it applies: fp32 panels, no bias, a weight
        finite in the copy's dtype whose row norms are finite in fp32. Returns whether it
        is attached."""
        if self.fmt != quant.FP32 or self.bias is not None:
            return False
        try:
            self.screen = ArgmaxScreen(self.weight.detach().float(), self._gemm)
        except ValueError:  # not finite in the copy's dtype, or a row norm beyond float32
            return False
        return True

    @property
    def extra_bytes(self) -> int:
        """Bytes of the panels (and of the screen's copy)."""
        screen = self.screen.extra_bytes if self.screen is not None else 0
        return self.panels.numel() * self.panels.element_size() + screen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > PACKED_HEAD_ROWS:
            return F.linear(x, self.weight, self.bias)
        if self.fmt == quant.FP32:
            y = self._gemm.mm(x, self.panels, self.weight.shape[0])
        else:
            y = self._gemm.qmm(x, self.panels, self.fmt, self.weight.shape[0])
        return y if self.bias is None else y.add_(self.bias)

    def argmax_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] fp32 whose row-wise argmax (first index on ties) and maximum
        equal those of `forward(x)`; entries the screen ruled out hold their approximate
        values (`ArgmaxScreen.logits`). For rows only sampled greedily, with no logit
        processor, logprob or grammar reading them."""
        if self.screen is None or x.shape[0] > self.screen.rows:
            return self.forward(x)
        out = self.screen.logits(x, self._columns)
        return self.forward(x) if out is None else out

    def _columns(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """forward(x)[:, ids] without the other columns: the same kernel, rows and k order
        over panels of just those vocabulary rows, so the same values bit for bit."""
        return self._gemm.mm(x, pack_panels(self.weight.detach()[ids]), ids.numel())
