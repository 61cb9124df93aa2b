"""Mixture-of-experts: the memory bill (all parameters) vs the bandwidth bill (active ones).

Memory: every expert must be resident, so an MoE model needs memory for its total
parameters (Mixtral-8x7B: 46.7B; DeepSeek-V3: 671B).

Bandwidth: a decode step reads only the experts its tokens are routed to. One token
(batch 1) reads the active parameters (Mixtral: 12.9B, 2 of 8 experts; DeepSeek-V3: 37B,
8 of 256 routed experts plus the shared one). A batch of n tokens routed uniformly and
independently reads E_active(n) = E (1 - (1 - k/E)^n) experts per layer
(`radixlm.plan.weights`), so the bytes read per step climb from the active-parameter bill
toward the total-parameter bill as the batch grows, and the weight bytes per token fall
only once the batch is well past the point where every expert is busy.

"All experts active" is reported two ways: the batch at which the expected number of
idle experts drops below one, E (1 - k/E)^n < 1  =>  n > ln E / -ln(1 - k/E)
(Mixtral: 8 tokens; DeepSeek-V3: 175 tokens), and the batches at which the expected
active fraction reaches 50 / 90 / 99%.

Arithmetic intensity of the expert weights at batch n: each token multiplies with k
experts of p_e parameters, so FLOPs are 2 n k p_e against E_active(n) p_e b bytes read,
    I_experts(n) = 2 n k / (E_active(n) b).
While n k << E, E_active(n) ~= n k and I ~= 2 / b: batching buys no reuse, every token
brings its own experts. Only once all experts are active does I grow like 2 n k / (E b),
so MoE decode needs about E / k times the batch of a dense model to reach the same
intensity and turn compute-bound.

Expert traffic against dense models (`expert_traffic`): the feed-forward weights one
decode step of b tokens reads in the sparse layers, L (E_active(b) p_e + p_s) for routed
experts of p_e = 3 H I parameters and a shared expert of p_s, beside a dense SwiGLU model
of the same active parameters (FFN width k I + shared: reads L (k p_e + p_s) whatever b)
and one of the same total parameters (width E I + shared: L (E p_e + p_s)). The MoE reads
what the first reads at b = 1 and climbs to what the second reads as b grows. The
router's E H weights per layer are left out of all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixlm.plan.dtypes import weight_bytes_per_param
from radixlm.plan.models import ModelSpec
from radixlm.plan.validate import NON_NEGATIVE_INT, POSITIVE_INT
from radixlm.plan.weights import (
    distinct_experts,
    expected_distinct_experts,
    tokens_for_expert_fraction,
    weights_bytes,
    weights_read_bytes,
)


def batch_all_experts_active(model: ModelSpec) -> int:
    """Smallest n with fewer than one expected idle expert: E (1 - k/E)^n < 1."""
    e, k = model.num_experts, model.experts_per_token
    if not model.is_moe or k >= e:
        return 1
    return math.floor(math.log(e) / -math.log(1.0 - k / e)) + 1


def expert_intensity(model: ModelSpec, tokens: int, dtype: str = "bf16") -> float:
    """FLOP/byte of the routed-expert matmuls at `tokens` tokens per step."""
    active = expected_distinct_experts(model, tokens)
    return 2.0 * tokens * model.experts_per_token / (active * weight_bytes_per_param(dtype))


def moe_bills(model: ModelSpec, dtype: str = "bf16") -> dict:
    """Memory bill vs per-token bandwidth bill, and the all-experts-active batch sizes."""
    total = weights_bytes(model, dtype)
    per_token = weights_read_bytes(model, 1, dtype)
    return {
        "total_params": model.total_params(),
        "active_params": model.active_params(),
        "num_experts": model.num_experts,
        "experts_per_token": model.experts_per_token,
        "shared_expert_intermediate_size": model.shared_expert_intermediate_size,
        "moe_layers": model.num_moe_layers,
        "memory_bytes": total,
        "bandwidth_bytes_per_token_batch1": per_token,
        "memory_to_bandwidth_ratio": total / per_token,
        "batch_all_experts_active": batch_all_experts_active(model),
        "batch_50pct_active": tokens_for_expert_fraction(model, 0.5),
        "batch_90pct_active": tokens_for_expert_fraction(model, 0.9),
        "batch_99pct_active": tokens_for_expert_fraction(model, 0.99),
    }


def moe_batch_table(model: ModelSpec, batches: tuple[int, ...], dtype: str = "bf16") -> list[dict]:
    """Per batch size: active experts per layer, weight bytes read per step and per token,
    and the routed-expert arithmetic intensity."""
    rows = []
    for n in batches:
        POSITIVE_INT.check("batch", n)
        read = weights_read_bytes(model, n, dtype)
        active = expected_distinct_experts(model, n)
        rows.append(
            {
                "batch": n,
                "active_experts": active,
                "active_fraction": active / model.num_experts,
                "weights_read_bytes": read,
                "weights_read_per_token": read / n,
                "expert_intensity": expert_intensity(model, n, dtype),
            }
        )
    return rows


@dataclass(frozen=True)
class ExpertLayout:
    """The sparse feed-forward layers of an MoE model: `layers` layers of `num_experts`
    routed SwiGLU experts of width `intermediate` over `hidden`, `top_k` per token, and a
    shared expert of width `shared_intermediate` (0: none). Raises ValueError unless
    every size is >= 1 (shared >= 0) and top_k <= num_experts."""

    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    layers: int = 1
    shared_intermediate: int = 0

    def __post_init__(self):
        for name in ("num_experts", "top_k", "hidden", "intermediate", "layers"):
            POSITIVE_INT.check(name, getattr(self, name))
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        NON_NEGATIVE_INT.check("shared_intermediate", self.shared_intermediate)

    @classmethod
    def of(cls, model: ModelSpec) -> ExpertLayout:
        """The sparse layers of an MoE `model` (its dense layers are left out)."""
        if not model.is_moe:
            raise ValueError(f"{model.name} is dense: it has no experts")
        return cls(
            num_experts=model.num_experts,
            top_k=model.experts_per_token,
            hidden=model.hidden_size,
            intermediate=model.moe_intermediate_size,
            layers=model.num_moe_layers,
            shared_intermediate=model.shared_expert_intermediate_size,
        )

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert: gate, up [I, H] and down [H, I]."""
        return 3 * self.hidden * self.intermediate

    @property
    def shared_params(self) -> int:
        return 3 * self.hidden * self.shared_intermediate

    def distinct(self, tokens: float) -> float:
        """Expected distinct routed experts per layer for `tokens` tokens."""
        return distinct_experts(self.num_experts, self.top_k, tokens)


def expert_traffic(
    layout: ExpertLayout, batches: tuple[int, ...], dtype: str = "bf16"
) -> list[dict]:
    """Per decode batch b: expected distinct experts per layer and the feed-forward weight
    bytes one step reads, MoE vs dense of the same active and of the same total parameters
    (module docstring), in weight format `dtype`."""
    per = weight_bytes_per_param(dtype)
    p_e, p_s, n_layers = layout.expert_params, layout.shared_params, layout.layers
    dense_active = n_layers * (layout.top_k * p_e + p_s) * per
    dense_total = n_layers * (layout.num_experts * p_e + p_s) * per
    rows = []
    for b in batches:
        POSITIVE_INT.check("batch", b)
        active = layout.distinct(b)
        moe = n_layers * (active * p_e + p_s) * per
        rows.append(
            {
                "batch": b,
                "distinct_experts": active,
                "active_fraction": active / layout.num_experts,
                "moe_bytes": moe,
                "dense_same_active_bytes": dense_active,
                "dense_same_total_bytes": dense_total,
                "moe_over_dense_active": moe / dense_active,
                "moe_over_dense_total": moe / dense_total,
            }
        )
    return rows
