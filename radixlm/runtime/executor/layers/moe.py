"""The sparse Mixture-of-Experts feed-forward block (Mixtral, Qwen2-MoE, Qwen3-MoE).

A router `gate` [E, hidden] scores every token against E experts; each token runs through
its top-k experts (SwiGLU MLPs of width `intermediate`) and sums their outputs weighted by
the routing probabilities (Shazeer et al. 2017, "Outrageously Large Neural Networks";
Jiang et al. 2024, "Mixtral of Experts"). Qwen2-MoE adds a shared expert every token runs,
scaled by sigmoid(shared_expert_gate(x)).

Routing follows transformers 5.25 (`models/{mixtral,qwen2_moe,qwen3_moe}/modeling_*.py`):
logits = x @ gate.T in x's dtype, softmax over the experts in fp32, top-k (torch.topk, so
the same experts on ties), the k weights renormalised to sum 1 where `norm_topk_prob`
(Mixtral always), cast back to x's dtype. The sigmoid router takes sigmoid(logits) in fp32
instead of the softmax.

DeepSeek's routers add (transformers 5.25 `models/deepseek_v{2,3}/modeling_*.py`;
DeepSeek-V2 report section 2.2; DeepSeek-V3 report section 2.1.2):
  * a group limit (`num_groups` > 1): the E experts form equal groups, each scored by its
    best expert (V2's group_limited_greedy, `group_score` "max") or the sum of its best two
    (V3, "top2_sum"); only the experts of the `topk_groups` best groups may be chosen;
  * V3's correction bias (`correction_bias`, the gate's `e_score_correction_bias` [E]):
    added to the scores to choose the experts, not to their weights;
  * `routed_scaling_factor`, multiplying the final weights.
The weights are the chosen experts' scores (gathered, so without the bias).

The block holds its weights under the checkpoint's names relative to `prefix`
(`gate.weight`, `experts.{e}.{gate,up,down}_proj.weight`, `shared_expert.*`,
`shared_expert_gate.weight`); its experts implementation (`layers.moe_experts`) decides
what holds the experts and how they are stored once loaded. Every forward records the
number of distinct experts it touched in `counter` (`ExpertCounter`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.executor.layers.moe_experts import ExpertsImpl, TorchExperts

ROUTERS = ("softmax", "sigmoid")
GROUP_SCORES = ("max", "top2_sum")


@dataclass(frozen=True)
class MoEOptions:
    """Shape and routing of one sparse MoE block.

    Args:
        num_experts: routed experts E. top_k: experts per token, 1 <= top_k <= E.
        hidden, intermediate: the model width and each routed expert's SwiGLU width.
        router: "softmax" (Mixtral, Qwen) or "sigmoid" (DeepSeek-V3-style scores).
        norm_topk_prob: renormalise the top-k weights to sum 1.
        shared_intermediate: width of the shared expert every token runs, or None.
        shared_expert_gate: scale the shared expert by sigmoid(x @ shared_expert_gate.T).
        activation: the experts' gate activation; only "silu" (SwiGLU).
        num_groups, topk_groups: the group limit (module docstring); 1 and 1 for none.
        group_score: how a group is scored, one of `GROUP_SCORES`.
        correction_bias: the gate holds `e_score_correction_bias` [E], added to the scores
            for the choice only.
        routed_scaling_factor: multiplies the routed experts' weights.
    Raises ValueError on a bad value (named).
    """

    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    router: str = "softmax"
    norm_topk_prob: bool = True
    shared_intermediate: int | None = None
    shared_expert_gate: bool = False
    activation: str = "silu"
    num_groups: int = 1
    topk_groups: int = 1
    group_score: str = "max"
    correction_bias: bool = False
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"top_k must be in [1, num_experts={self.num_experts}], got {self.top_k}"
            )
        if self.hidden < 1 or self.intermediate < 1:
            raise ValueError(
                f"hidden and intermediate must be >= 1, got {self.hidden}, {self.intermediate}"
            )
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.activation != "silu":
            raise ValueError(f"activation must be 'silu', got {self.activation!r}")
        if self.shared_intermediate is not None and self.shared_intermediate < 1:
            raise ValueError(f"shared_intermediate must be >= 1, got {self.shared_intermediate}")
        if self.shared_expert_gate and self.shared_intermediate is None:
            raise ValueError("shared_expert_gate needs a shared expert (shared_intermediate)")
        self._check_groups()

    def _check_groups(self) -> None:
        g, e = self.num_groups, self.num_experts
        if g < 1 or e % g:
            raise ValueError(f"num_groups must divide num_experts={e}, got {g}")
        if not 1 <= self.topk_groups <= g:
            raise ValueError(f"topk_groups must be in [1, num_groups={g}], got {self.topk_groups}")
        if self.group_score not in GROUP_SCORES:
            raise ValueError(f"group_score must be one of {GROUP_SCORES}, got {self.group_score!r}")
        if g > 1 and self.group_score == "top2_sum" and e // g < 2:
            raise ValueError(f"group_score 'top2_sum' needs >= 2 experts per group, got {e // g}")
        if g > 1 and self.top_k > self.topk_groups * (e // g):
            raise ValueError(
                f"top_k={self.top_k} exceeds the experts of topk_groups={self.topk_groups} "
                f"groups of {e // g}"
            )

    @classmethod
    def from_config(cls, config) -> MoEOptions:
        """The options of a transformers Mixtral, Qwen2-MoE or Qwen3-MoE config (keys as
        their config classes name them). Raises ValueError for another model_type or a
        hidden_act other than silu."""
        model_type = getattr(config, "model_type", None)
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{model_type}: hidden_act {act!r} is not supported (only silu)")
        if model_type == "mixtral":
            return cls(
                num_experts=config.num_local_experts,
                top_k=config.num_experts_per_tok,
                hidden=config.hidden_size,
                intermediate=config.intermediate_size,
                norm_topk_prob=True,
            )
        if model_type in ("qwen2_moe", "qwen3_moe"):
            shared = config.shared_expert_intermediate_size if model_type == "qwen2_moe" else None
            return cls(
                num_experts=config.num_experts,
                top_k=config.num_experts_per_tok,
                hidden=config.hidden_size,
                intermediate=config.moe_intermediate_size,
                norm_topk_prob=bool(config.norm_topk_prob),
                shared_intermediate=shared,
                shared_expert_gate=shared is not None,
            )
        raise ValueError(f"no MoE options for model_type {model_type!r}")


class ExpertCounter:
    """Distinct experts touched per forward of one MoE layer.

    `record(n)` takes an int or a 0-d integer tensor; a CUDA tensor is summed on its
    device, so recording never waits for the GPU (read `total`/`last` to synchronise).
    A replayed CUDA graph runs no Python, so forwards inside one are not recorded.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self._total: int | torch.Tensor = 0
        self._last: int | torch.Tensor = 0

    def record(self, num_distinct: int | torch.Tensor) -> None:
        if isinstance(num_distinct, torch.Tensor) and num_distinct.device.type == "cpu":
            num_distinct = int(num_distinct)
        self.steps += 1
        self._total = self._total + num_distinct
        self._last = num_distinct

    @property
    def total(self) -> int:
        """Sum over recorded forwards of the distinct experts each touched."""
        return int(self._total)

    @property
    def last(self) -> int:
        """Distinct experts the latest forward touched (0 before any)."""
        return int(self._last)

    @property
    def mean(self) -> float:
        """Mean distinct experts per recorded forward (0.0 before any)."""
        return self.total / self.steps if self.steps else 0.0


def route(
    logits: torch.Tensor, opts: MoEOptions, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of router logits [T, E] (see the module docstring); `bias` [E] is the
    correction bias where `opts.correction_bias`.

    Returns weights [T, k] in logits' dtype and expert ids [T, k] int64, each row's
    experts in descending score order."""
    if opts.router == "softmax":
        scores = F.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
    choice = scores if bias is None else scores + bias.float()
    if opts.num_groups > 1:
        choice = _limit_to_groups(choice, opts)
    ids = torch.topk(choice, opts.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if opts.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if opts.routed_scaling_factor != 1.0:
        weights = weights * opts.routed_scaling_factor
    return weights.to(logits.dtype), ids


def _limit_to_groups(choice: torch.Tensor, opts: MoEOptions) -> torch.Tensor:
    """choice [T, E] with the experts outside each token's `topk_groups` best groups set to
    -inf (groups scored by `opts.group_score`)."""
    t, e, g = choice.shape[0], choice.shape[1], opts.num_groups
    grouped = choice.view(t, g, e // g)
    if opts.group_score == "max":
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    best = torch.topk(group_scores, opts.topk_groups, dim=-1).indices
    keep = torch.zeros(t, g, dtype=torch.bool, device=choice.device).scatter_(1, best, True)
    return choice.masked_fill(~keep.repeat_interleave(e // g, dim=1), float("-inf"))


def distinct_experts(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many of `num_experts` experts appear in ids [T, k]: a 0-d int64 tensor on ids'
    device (no host synchronisation)."""
    flat = ids.flatten()
    # scatter_add, not bincount: CUDA's bincount reads the maximum id back to the host.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat)).count_nonzero()


class SparseMoeBlock(nn.Module):
    """The MoE feed-forward block: forward(x float [T, hidden]) -> [T, hidden] in x's dtype.

    Args:
        opts: shapes and routing (`MoEOptions`).
        experts_impl: what holds and runs the experts (`TorchExperts`, `PackedExperts`,
            `TritonExperts` from `layers.moe_experts`); default `TorchExperts()`.
        prefix: the block's checkpoint name (e.g. "model.layers.3.mlp"); the experts'
            names under it let a panel source find per-weight data (GGUF blocks).

    Holds `gate` (nn.Linear [E, hidden], no bias; with `opts.correction_bias` also its
    `e_score_correction_bias` [E]), `experts` (E holders with gate_proj /
    up_proj / down_proj, from `experts_impl.expert`) and, with a shared expert,
    `shared_expert` and `shared_expert_gate` [1, hidden]. `process_weights_after_loading`
    hands the loaded experts to `experts_impl.build`, whose module `grouped_experts`
    replaces `experts` (the per-expert holders are released). `counter` counts distinct
    experts per forward.
    """

    def __init__(self, opts: MoEOptions, experts_impl: ExpertsImpl | None = None, prefix: str = ""):
        super().__init__()
        self.opts = opts
        self.impl = experts_impl or TorchExperts()
        self.prefix = prefix
        sep = f"{prefix}." if prefix else ""
        self.gate = nn.Linear(opts.hidden, opts.num_experts, bias=False)
        if opts.correction_bias:
            bias = torch.zeros(opts.num_experts)
            self.gate.e_score_correction_bias = nn.Parameter(bias, requires_grad=False)
        self.experts = nn.ModuleList(
            self.impl.expert(opts.hidden, opts.intermediate, f"{sep}experts.{e}")
            for e in range(opts.num_experts)
        )
        self.shared_expert = None
        self.shared_expert_gate = None
        if opts.shared_intermediate is not None:
            self.shared_expert = self.impl.expert(
                opts.hidden, opts.shared_intermediate, f"{sep}shared_expert"
            )
            if opts.shared_expert_gate:
                self.shared_expert_gate = nn.Linear(opts.hidden, 1, bias=False)
        self.counter = ExpertCounter()
        self.grouped_experts: nn.Module | None = None

    def process_weights_after_loading(self) -> None:
        """Give the loaded experts their final storage (`experts_impl.build`)."""
        self.grouped_experts = self.impl.build(list(self.experts))
        del self.experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grouped_experts is None:
            raise RuntimeError("SparseMoeBlock: call process_weights_after_loading() first")
        w = self.gate.weight
        # A router kept in fp32 (DeepSeek-V3's) scores x in fp32.
        logits = self.gate(x) if w.dtype == x.dtype else F.linear(x.to(w.dtype), w)
        bias = getattr(self.gate, "e_score_correction_bias", None)
        weights, ids = route(logits, self.opts, bias)
        weights = weights.to(x.dtype)
        self.counter.record(distinct_experts(ids, self.opts.num_experts))
        out = self.grouped_experts(x, ids, weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out
