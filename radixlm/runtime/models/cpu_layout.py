"""CPU weight layouts for a loaded causal LM: packed panels, or torch's input-major layout.

Decode steps multiply a few rows by every weight, so they stream the weights from memory.
MKL reads nn.Linear's [out, in] layout slowly for few rows and threads such small products
poorly. Two layouts, chosen once at load time by `use_cpu_layout`:

* **packed** (fp32, where `radixlm.kernels.cpu.PackedGemm` builds): each projection holds
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
* **input-major** (the fallback: other dtypes, or no compiler/AVX2): projections store
  W^T [in, out] for `torch.mm`; the head adds a W^T copy used for at most `FEW_ROWS` rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu import PackedGemm, pack_panels

#: Rows up to which the input-major head uses its transposed copy (MKL, 1 thread: 1 row
#: 8.6 -> 4.8 ms, 3 rows 30.9 -> 14.3 ms, but 4 rows 21 -> 28 ms).
FEW_ROWS = 3
#: Rows up to which the packed head uses its panels (above: MKL on the original weight,
#: which is faster for prefill-sized products).
PACKED_HEAD_ROWS = 256


class PackedLinear(nn.Module):
    """A linear layer holding only `panels` [ceil(out / 16), in, 16] fp32 (and `bias`).

    forward(x [rows, in] fp32) -> [rows, out] fp32 through the packed GEMM kernel.
    """

    def __init__(self, linear: nn.Linear, gemm: PackedGemm):
        super().__init__()
        self.out_features = linear.out_features
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


class PackedHead(nn.Module):
    """lm_head holding `weight` [vocab, hidden] (the original parameter, possibly tied to the
    embedding) and `panels` of it: packed GEMM for at most `PACKED_HEAD_ROWS` rows,
    `F.linear` above. forward(x [rows, hidden] fp32) -> logits [rows, vocab] fp32."""

    def __init__(self, head: nn.Linear, gemm: PackedGemm):
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias
        self.register_buffer("panels", pack_panels(head.weight), persistent=False)
        self._gemm = gemm

    @property
    def extra_bytes(self) -> int:
        """Bytes of the panels."""
        return self.panels.numel() * self.panels.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > PACKED_HEAD_ROWS:
            return F.linear(x, self.weight, self.bias)
        y = self._gemm.mm(x, self.panels, self.weight.shape[0])
        return y if self.bias is None else y.add_(self.bias)


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


def use_cpu_layout(model: nn.Module, gemm: PackedGemm | None) -> int:
    """Convert a loaded causal LM in place: every nn.Linear under `model.model` and
    `model.lm_head` take the packed layout when `gemm` is given and the weights are fp32,
    else the input-major one. Returns the bytes added (the head's second layout, plus any
    panel padding)."""
    packed = gemm is not None and model.lm_head.weight.dtype == torch.float32
    added = 0
    for parent in list(model.model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                layer = PackedLinear(child, gemm) if packed else InputMajorLinear(child)
                setattr(parent, name, layer)
                added += layer.extra_bytes
    model.lm_head = PackedHead(model.lm_head, gemm) if packed else FewRowsHead(model.lm_head)
    return added + model.lm_head.extra_bytes
