"""CPU weight layouts: linear layers stored input-major, the head in both layouts.

nn.Linear keeps W [out, in] row-major and computes `x @ W^T`. With MKL on CPU that
layout is slow for the few-row products of decode steps; stored input-major (W^T
[in, out] contiguous), `torch.mm(x, W^T)` reads the same bytes faster. Measured on the
2-core AVX2 CI machine (MKL 2024.2), SmolLM2-135M fp32:

* the 120 decoder projections, 1 row, weights cold in memory (quiet machine): one
  thread 32.8 -> 26.0 ms per pass (12.9 -> 16.4 GB/s), two threads 31.0 -> 25.0 ms;
  from 4 rows on the two layouts cost about the same;
* the 49152 x 576 head, one thread: 1 row 8.6 -> 4.8 ms, 2 rows 20.2 -> 9.5 ms, 3 rows
  30.9 -> 14.3 ms, but 4 rows 21 -> 28 ms and 16 rows 35 -> 39 ms. The head therefore
  keeps both layouts (`FewRowsHead`) and picks by row count; the tied embedding keeps
  reading the original.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Rows up to which the head uses its transposed copy (see the module docstring).
FEW_ROWS = 3


class InputMajorLinear(nn.Module):
    """A linear layer holding `weight_t` [in, out] contiguous (and `bias` [out] or None).

    forward(x [rows, in]) -> [rows, out] in x's dtype (`torch.mm` / `torch.addmm`).
    """

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
    most `FEW_ROWS` rows, `F.linear(x, weight)` above. The copy costs vocab * hidden *
    element size bytes (113 MB for SmolLM2-135M in fp32), reported by `extra_bytes`.
    """

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias
        self.register_buffer("weight_t", head.weight.detach().t().contiguous(), persistent=False)

    @property
    def extra_bytes(self) -> int:
        """Bytes of the transposed copy."""
        return self.weight_t.numel() * self.weight_t.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > FEW_ROWS:
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def use_cpu_layout(model: nn.Module) -> int:
    """Convert a loaded causal LM in place: every nn.Linear under `model.model` becomes an
    `InputMajorLinear` (same bytes), `model.lm_head` a `FewRowsHead`. Returns the bytes
    added (the head's transposed copy)."""
    for parent in list(model.model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, InputMajorLinear(child))
    model.lm_head = FewRowsHead(model.lm_head)
    return model.lm_head.extra_bytes
