"""Per-parameter shard specs: which slice of a checkpoint tensor a tensor-parallel rank
holds.

A module built for one rank declares `tp_shards = {param name: Shard | None}`; the loader
(`executor/weights.py`) slices the full checkpoint tensor of each declared parameter
with `shard_state` before loading, so no layer branches on the rank at load time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Shard:
    """Rows [start, stop) of dimension `dim`, zero-padded to `size` rows when given (the
    last vocabulary part of a vocabulary that does not divide by the ranks)."""

    dim: int
    start: int
    stop: int
    size: int | None = None

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of `full` (a copy, padded with zeros to `size`)."""
        part = full.narrow(self.dim, self.start, self.stop - self.start)
        if self.size is None or self.size == part.shape[self.dim]:
            return part.contiguous()
        shape = list(part.shape)
        shape[self.dim] = self.size
        out = part.new_zeros(shape)
        out.narrow(self.dim, 0, part.shape[self.dim]).copy_(part)
        return out


def shard_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (full checkpoint tensors by parameter name) with every parameter that a
    module of `model` declares in its `tp_shards` replaced by this rank's slice, or
    dropped where the spec is None (a tensor this rank does not hold: another rank's
    expert under expert parallelism); tensors without a spec (norms, replicated weights)
    pass unchanged."""
    out = dict(state)
    for prefix, module in model.named_modules():
        for param, shard in getattr(module, "tp_shards", {}).items():
            name = f"{prefix}.{param}" if prefix else param
            if name in out:
                if shard is None:
                    del out[name]
                else:
                    out[name] = shard.take(out[name])
    return out
