"""The output projection (lm_head) for CPU decode steps with few rows.

On CPU, `F.linear(x, W)` with W [vocab, hidden] row-major reads the 49k-row head of a
small model at about half the memory bandwidth when x has 1-3 rows, and its cost grows
with each row (MKL picks a dot-product kernel for that layout); `x @ W^T` with W^T stored
[hidden, vocab] contiguous streams the weights once per step at the copy bandwidth.
Measured on the 2-core AVX2 CI machine (MKL 2024.2, SmolLM2-135M head 49152 x 576,
one thread): 1 row 8.6 -> 4.8 ms, 2 rows 20.2 -> 9.5 ms, 3 rows 30.9 -> 14.3 ms; from 4
rows `F.linear` is the faster of the two (21 vs 28 ms), so larger batches keep it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Rows up to which the transposed copy is used (see the module docstring).
FEW_ROWS = 3


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


def use_few_rows_head(model: nn.Module) -> int:
    """Replace `model.lm_head` (an nn.Linear) by a `FewRowsHead`; returns the added bytes."""
    model.lm_head = FewRowsHead(model.lm_head)
    return model.lm_head.extra_bytes
