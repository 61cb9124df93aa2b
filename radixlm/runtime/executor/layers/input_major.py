"""The input-major CPU layout (the fallback where the packed one cannot run: other dtypes,
no compiler or AVX2, `--cpu-gemm torch`): projections store W^T [in, out] for `torch.mm`,
which reads it faster than nn.Linear's [out, in] for the few rows of a decode step; the
head adds a W^T copy used for at most `FEW_ROWS` rows (see docs/perf-notes.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.executor.layers.base import TorchLayers

#: Rows up to which the input-major head uses its transposed copy; above, F.linear on the
#: original weight is faster (see docs/perf-notes.md).
FEW_ROWS = 3


class InputMajorLinear(nn.Module):
    """A projection holding `weight` [out, in] until loaded, then `weight_t` [in, out]
    contiguous in its place (and `bias` [out] or None throughout).

    forward(x [rows, in]) -> [rows, out] in x's dtype (`torch.mm` / `torch.addmm`); only
    after `process_weights_after_loading`.
    """

    extra_bytes = 0

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def process_weights_after_loading(self) -> None:
        self.weight_t = nn.Parameter(self.weight.detach().t().contiguous(), requires_grad=False)
        del self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)


class FewRowsHead(nn.Module):
    """lm_head holding `weight` [vocab, hidden] (possibly tied to the embedding) and, once
    loaded, a contiguous `weight_t` [hidden, vocab] copy (a buffer, never saved).

    forward(x [rows, hidden]) -> logits [rows, vocab] in x's dtype; `x @ weight_t` for at
    most `FEW_ROWS` rows, `F.linear(x, weight)` above.
    """

    def __init__(self, hidden: int, vocab: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, hidden), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(vocab), requires_grad=False) if bias else None
        self.register_buffer("weight_t", None, persistent=False)

    def process_weights_after_loading(self) -> None:
        self.weight_t = self.weight.detach().t().contiguous()

    @property
    def extra_bytes(self) -> int:
        """Bytes of the transposed copy (vocab * hidden * element size; 0 before loading)."""
        t = self.weight_t
        return 0 if t is None else t.numel() * t.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > FEW_ROWS:
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(x, self.weight_t)
        return y if self.bias is None else y + self.bias


class InputMajorCpuLayers(TorchLayers):
    """`TorchLayers` with input-major projections and head."""

    cpu_layout = "input-major"

    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return InputMajorLinear(in_features, out_features, bias)

    def lm_head(self, hidden: int, vocab: int, bias: bool = False) -> nn.Module:
        return FewRowsHead(hidden, vocab, bias)
