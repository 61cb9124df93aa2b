"""Tensor-parallel mixture-of-experts blocks: every expert split inside itself, or
(expert parallelism, `--ep-size`) whole experts placed on the ranks.

Each rank holds a 1/N slice of every expert's SwiGLU width: its gate_proj and up_proj
rows (columns of the output) [I/N, H] and down_proj's matching input columns [H, I/N],
so a rank's experts produce partial outputs whose sum over the ranks is the full block's
output (the row-parallel argument of Megatron-LM, Shoeybi et al. 2019, applied per
expert; SGLang and vLLM split fused-MoE weights the same way). The shared expert is
split alike, and its sigmoid gate, being a per-token scalar, scales each partial
output. The router (and DeepSeek-V3's correction bias) is replicated, so every rank
chooses the same experts for every token; one all-reduce after the block sums the parts.

Expert parallelism (`WholeExperts`) runs inside the tensor-parallel group, whose
attention leaves every rank with every token: the dispatch is each rank selecting the
(token, expert) pairs of the experts it holds, and the combine is the same all-reduce
(a reduce-scatter plus all-gather), so no all-to-all is needed (tokens split across
ranks, as under data-parallel attention, would need one).
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.executor.layers.blocks import MLP
from radixlm.runtime.executor.layers.moe import MoEOptions, SparseMoeBlock
from radixlm.runtime.executor.layers.moe_experts import (
    ExpertsImpl,
    StackedExperts,
    grouped_by_expert,
)
from radixlm.runtime.executor.parallel.group import TPGroup
from radixlm.runtime.executor.parallel.shards import Shard


class ExpertSliceLinears:
    """`linear()` for one rank's slice of an expert's SwiGLU projections: gate_proj and
    up_proj keep output rows [r * I/N, (r + 1) * I/N), down_proj the same input columns;
    no communication (the block all-reduces once). Raises ValueError for a bias or a
    width the ranks do not divide."""

    def __init__(self, group: TPGroup):
        self.group = group

    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        n, r = self.group.size, self.group.rank
        down = name.endswith("down_proj")
        width = in_features if down else out_features
        if bias or width % n:
            raise ValueError(f"tensor parallelism cannot split expert projection {name}")
        local = width // n
        if down:
            module = nn.Linear(local, out_features, bias=False)
            module.tp_shards = {"weight": Shard(1, r * local, (r + 1) * local)}
        else:
            module = nn.Linear(in_features, local, bias=False)
            module.tp_shards = {"weight": Shard(0, r * local, (r + 1) * local)}
        return module


class ExpertSlices(ExpertsImpl):
    """Experts holding this rank's slices (`ExpertSliceLinears`), stacked after loading
    and run by torch GEMMs (`StackedExperts`): w13 [E, 2I/N, H], w2 [E, H, I/N]."""

    name = "torch-tp"

    def __init__(self, group: TPGroup):
        self.linears = ExpertSliceLinears(group)

    def expert(self, hidden, intermediate, prefix):
        return MLP(hidden, intermediate, self.linears, prefix)

    def build(self, experts):
        return StackedExperts(experts)


class _WholeLinears:
    """nn.Linear projections for an expert a rank holds whole."""

    @staticmethod
    def linear(name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return nn.Linear(in_features, out_features, bias=bias)


class _NotHeld(nn.Module):
    """Another rank's expert: no parameters; its checkpoint tensors are dropped."""

    def __init__(self):
        super().__init__()
        self.tp_shards = {f"{p}.weight": None for p in ("gate_proj", "up_proj", "down_proj")}


class LocalExperts(StackedExperts):
    """The grouped forward over the routed experts [first, first + E/N) this rank holds
    (stacked w13 [E/N, 2I, H], w2 [E/N, H, I]): the pairs routed to other ranks' experts
    are gathered into one bucket that is not computed (those ranks add their rows
    through the block's all-reduce)."""

    def __init__(self, experts: list[nn.Module], first: int):
        super().__init__(experts)
        self.first, self.count = first, len(experts)

    def _run(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(rows) if e == self.count else super()._run(e, rows)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        held = (local >= 0) & (local < self.count)
        local = local.masked_fill(~held, self.count)
        return grouped_by_expert(x, local, weights * held, self.count + 1, self._run)


class WholeExperts(ExpertsImpl):
    """Expert parallelism over the tensor-parallel ranks (every rank sees every token, so
    dispatch is a local selection and the combine is the block's all-reduce): rank r holds
    routed experts [r * E/N, (r + 1) * E/N) whole; the shared expert is split as in
    `ExpertSlices`."""

    name = "torch-ep"

    def __init__(self, group: TPGroup, num_experts: int):
        self.count = num_experts // group.size
        self.first = group.rank * self.count
        self.slices = ExpertSliceLinears(group)

    def expert(self, hidden, intermediate, prefix):
        if prefix.endswith("shared_expert"):
            return MLP(hidden, intermediate, self.slices, prefix)
        e = int(prefix.rsplit(".", 1)[1])
        if self.first <= e < self.first + self.count:
            return MLP(hidden, intermediate, _WholeLinears(), prefix)
        return _NotHeld()

    def build(self, experts):
        held = experts[self.first : self.first + self.count]
        return LocalExperts(held, self.first)


class TensorParallelMoeBlock(SparseMoeBlock):
    """A `SparseMoeBlock` whose experts are this rank's slices (`ExpertSlices`) or, with
    `expert_parallel`, this rank's whole experts (`WholeExperts`): forward(x [T, hidden])
    -> the full block's output [T, hidden], summed over the ranks by one all-reduce."""

    def __init__(
        self, group: TPGroup, opts: MoEOptions, prefix: str = "", expert_parallel: bool = False
    ):
        impl = WholeExperts(group, opts.num_experts) if expert_parallel else ExpertSlices(group)
        super().__init__(opts, impl, prefix)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce_(super().forward(x).contiguous())
