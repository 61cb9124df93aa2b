"""Tensor-parallel mixture-of-experts blocks: every expert split inside itself.

Each rank holds a 1/N slice of every expert's SwiGLU width: its gate_proj and up_proj
rows (columns of the output) [I/N, H] and down_proj's matching input columns [H, I/N],
so a rank's experts produce partial outputs whose sum over the ranks is the full block's
output (the row-parallel argument of Megatron-LM, Shoeybi et al. 2019, applied per
expert; SGLang and vLLM split fused-MoE weights the same way). The shared expert is
split alike, and its sigmoid gate, being a per-token scalar, scales each partial
output. The router (and DeepSeek-V3's correction bias) is replicated, so every rank
chooses the same experts for every token; one all-reduce after the block sums the parts.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.executor.layers.blocks import MLP
from radixlm.runtime.executor.layers.moe import MoEOptions, SparseMoeBlock
from radixlm.runtime.executor.layers.moe_experts import ExpertsImpl, StackedExperts
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


class TensorParallelMoeBlock(SparseMoeBlock):
    """A `SparseMoeBlock` whose experts are this rank's slices (`ExpertSlices`):
    forward(x [T, hidden]) -> the full block's output [T, hidden], summed over the ranks
    by one all-reduce."""

    def __init__(self, group: TPGroup, opts: MoEOptions, prefix: str = ""):
        super().__init__(opts, ExpertSlices(group), prefix)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce_(super().forward(x).contiguous())
