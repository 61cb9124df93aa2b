"""Experts implementations for `layers.moe.SparseMoeBlock`: what holds each expert's
weights while loading, their final storage, and the grouped computation of a step.

Every implementation groups the step's (token, expert) pairs by expert, so an expert's
weights are read once per step however many of the batch's tokens chose it: a decode
step of b tokens reads E * (1 - (1 - k/E)^b) experts per layer on average under uniform
routing (`radixlm plan moe`), not b * k.

* `TorchExperts` (the reference and CPU fallback): experts stacked as w13 [E, 2I, H]
  (gate rows, then up rows) and w2 [E, H, I]; pairs sorted by expert id, one gate_up
  GEMM and one down GEMM per touched expert over its contiguous rows.
* `PackedExperts` (the packed CPU layout, in `layers/packed.py`): the same grouping, each
  expert a `PackedMLP` of the panel source (fp32 panels, or GGUF quantized panels where
  the file has them) multiplied by radixlm's C kernels.
* `TritonExperts` (CUDA): the stacked weights run by the Triton fused-MoE kernel
  (`radixlm.kernels.triton.fused_moe`).

The grouped forward's contract: forward(x [T, H], ids [T, k] int64, weights [T, k]) ->
[T, H] in x's dtype, sum over j of weights[t, j] * expert_{ids[t, j]}(x[t]).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.executor.layers.blocks import MLP


class ExpertsImpl(abc.ABC):
    """How a `SparseMoeBlock` holds and runs its experts (a strategy object)."""

    #: A short name for reports ("torch", "packed", "triton").
    name: str

    @abc.abstractmethod
    def expert(self, hidden: int, intermediate: int, prefix: str) -> nn.Module:
        """A SwiGLU expert named `prefix` holding `gate_proj`, `up_proj` and `down_proj`
        (weights [I, H], [I, H], [H, I] under those names until loaded); forward(x [rows,
        H]) -> [rows, H]. Also serves as the shared expert."""

    @abc.abstractmethod
    def build(self, experts: list[nn.Module]) -> nn.Module:
        """The grouped module over the loaded `experts` (from `expert`, each already past
        its own post-load step), with the grouped forward of the module docstring."""


def grouped_by_expert(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    num_experts: int,
    run: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The grouped forward (module docstring) with `run(e, rows [n, H]) -> [n, H]` applying
    expert e to its n contiguous rows, called once per touched expert in ascending order.

    The T * k pairs are sorted by expert id (stable argsort); each output row is
    weights * run(...), added into its token's row in ascending expert order, as
    transformers' MoE experts loop does."""
    k = ids.shape[1]
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    tokens = order // k  # the token of each sorted pair
    rows = x.index_select(0, tokens)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    outs, start = [], 0
    for e, n in enumerate(counts):
        if n:
            outs.append(run(e, rows[start : start + n]))
            start += n
    ys = torch.cat(outs) * weights.flatten().index_select(0, order)[:, None]
    return torch.zeros_like(x).index_add_(0, tokens, ys.to(x.dtype))


class _Linears:
    """nn.Linear projections for an expert `blocks.MLP` (what `TorchLayers.linear` gives;
    this module sits below the layer factories, which build MoE blocks of it)."""

    @staticmethod
    def linear(name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        return nn.Linear(in_features, out_features, bias=bias)


def _torch_expert(hidden: int, intermediate: int, prefix: str) -> nn.Module:
    return MLP(hidden, intermediate, _Linears(), prefix)


def _stack(experts: list[nn.Module]) -> tuple[nn.Parameter, nn.Parameter]:
    """w13 [E, 2I, H] (each expert's gate rows, then up rows) and w2 [E, H, I]."""
    w13 = torch.stack(
        [torch.cat([m.gate_proj.weight.detach(), m.up_proj.weight.detach()]) for m in experts]
    )
    w2 = torch.stack([m.down_proj.weight.detach() for m in experts])
    return nn.Parameter(w13, requires_grad=False), nn.Parameter(w2, requires_grad=False)


class StackedExperts(nn.Module):
    """Experts as stacked `w13` [E, 2I, H] and `w2` [E, H, I] run expert by expert over
    their grouped rows with torch GEMMs (`grouped_by_expert`)."""

    def __init__(self, experts: list[nn.Module]):
        super().__init__()
        self.w13, self.w2 = _stack(experts)

    def _run(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(rows, self.w13[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.w2[e])

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return grouped_by_expert(x, ids, weights, self.w13.shape[0], self._run)


class TorchExperts(ExpertsImpl):
    """Plain torch experts (`blocks.MLP` holders), stacked after loading
    (`StackedExperts`): the reference, on any device and dtype."""

    name = "torch"

    def expert(self, hidden, intermediate, prefix):
        return _torch_expert(hidden, intermediate, prefix)

    def build(self, experts):
        return StackedExperts(experts)


class TritonGroupedExperts(nn.Module):
    """Stacked `w13` [E, 2I, H] and `w2` [E, H, I] run by the Triton fused-MoE kernel
    (`radixlm.kernels.triton.fused_moe.fused_moe`; CUDA, or CPU under TRITON_INTERPRET=1)."""

    def __init__(self, experts: list[nn.Module]):
        super().__init__()
        self.w13, self.w2 = _stack(experts)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        from radixlm.kernels.triton.fused_moe import fused_moe

        return fused_moe(x, self.w13, self.w2, ids, weights)


class TritonExperts(ExpertsImpl):
    """Torch expert holders stacked after loading and run by the Triton fused-MoE kernel
    (`TritonGroupedExperts`). Importing Triton waits for the first forward."""

    name = "triton"

    def expert(self, hidden, intermediate, prefix):
        return _torch_expert(hidden, intermediate, prefix)

    def build(self, experts):
        return TritonGroupedExperts(experts)
