"""Multi-head latent attention (MLA; DeepSeek-V2, Liu et al. 2024, section 2.1; DeepSeek-V3
technical report, section 2.1.1) over a latent KV cache, in the absorbed or the expanded
form (`layers.mla_forms`).

Per token, the layer computes
  * the query: q = W_UQ (RMSNorm(W_DQ x)) with a LoRA rank (`q_lora_rank`), or W_Q x,
    split per head into q_nope [qk_nope_head_dim] and q_rope [qk_rope_head_dim];
  * the compressed KV: [c ; k_rope] = W_DKV x (`kv_a_proj_with_mqa`), the latent
    c = RMSNorm(c) of kv_lora_rank R values and one RoPE key k_rope shared by every head;
  * RoPE on q_rope and k_rope (rotate-half layout, or DeepSeek's interleaved pairs).
The expanded form up-projects c per head: k_nope = W_UK c, v = W_UV c (`kv_b_proj` holds
[W_UK ; W_UV] per head). The absorbed form folds W_UK into the query and W_UV into the
output instead: q_nope . (W_UK c) = (W_UK^T q_nope) . c, so attention runs as multi-query
attention with ONE KV head whose key is [c ; k_rope] (R + Dr values) and whose value is c
(the key's first R values), and its output o [H, R] becomes W_UV o per head before
`o_proj`. The cache holds exactly that key row (`memory.LatentKVPool`); the attention
backend sees q [T, H, R + Dr], k [T, 1, R + Dr], v [T, 1, R] and returns [T, H, R].
Decode and verify steps run the absorbed form; an EXTEND step runs whichever form
`mla_forms.MLAForms` picks for it by multiply-add count (the expanded form for prompts
without a cached prefix and for long chunks).

The softmax scale is (qk_nope_head_dim + qk_rope_head_dim) ** -0.5, times mscale^2 under
YaRN scaling with `mscale_all_dim` (DeepSeek's reference; transformers 5.25
`yarn_apply_mscale`), where mscale = 0.1 * mscale_all_dim * ln(factor) + 1 for factor > 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.kernels import AttentionBackend
from radixlm.runtime.executor.layers.blocks import apply_rotary
from radixlm.runtime.executor.layers.mla_forms import MLAForms
from radixlm.runtime.executor.parallel.shards import Shard

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.base import LayerFactory

#: The epsilon of the q and kv latent norms (DeepSeek's reference builds them with the
#: RMSNorm default, not the config's rms_norm_eps).
LATENT_NORM_EPS = 1e-6


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention-scale factor 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(config) -> float:
    """(qk_nope_head_dim + qk_rope_head_dim) ** -0.5, times yarn_mscale(factor,
    mscale_all_dim) ** 2 where the config's RoPE type is not "default" and sets a nonzero
    `mscale_all_dim`."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        m = yarn_mscale(params["factor"], params["mscale_all_dim"])
        scale *= m * m
    return scale


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE over interleaved pairs (x0, x1), (x2, x3), ... of x [T, heads, D], each pair
    rotated by one frequency (DeepSeek's layout); cos, sin [T, 1, D] are the rotate-half
    tables (each frequency twice). Returns the rotated pairs de-interleaved (evens, then
    odds), as transformers does: q and k share the layout, so q . k is unchanged."""
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class MLAAttention(nn.Module):
    """MLA self-attention (module docstring).

    Args:
        config: a DeepSeek-V2/V3 config (hidden_size, num_attention_heads, q_lora_rank,
            kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, attention_bias).
        layer_id: the layer's index (its KV pool buffer).
        layers: the factory of the projections (`{prefix}.q_proj` or `q_a_proj` /
            `q_b_proj`, `kv_a_proj_with_mqa`, `o_proj`) and the latent norms; its
            `head_range` gives the heads this layer computes (a tensor-parallel rank's
            share: q / q_b_proj, kv_b_proj and o_proj's input split by heads, the latent
            and its projections whole).
        prefix: the module's checkpoint name ("model.layers.i.self_attn").
        interleaved_rope: rotate interleaved pairs (DeepSeek's checkpoints) instead of
            halves.
        forms: the model's `MLAForms`, shared by its layers (default: one of this layer's
            own, mode "auto").

    `kv_b_proj` (weight [H * (qk_nope + v_head_dim), R]) stays a plain holder: after
    loading, `process_weights_after_loading` splits it into `w_uk` [H, qk_nope, R] and
    `w_uv` [H, v_head_dim, R] and drops it.

    Attributes read by the model runner and the backends: num_heads, num_kv_heads (1),
    head_dim (R + qk_rope_head_dim, the cached key row), scaling, sliding_window (None).
    forward(x float [T, hidden], rope (cos, sin) [T, 1, qk_rope_head_dim], backend, fb)
    -> [T, hidden].
    """

    sliding_window = None
    num_kv_heads = 1

    def __init__(
        self,
        config,
        layer_id: int,
        layers: LayerFactory,
        prefix: str,
        interleaved_rope: bool,
        forms: MLAForms | None = None,
    ):
        super().__init__()
        self.layer_id = layer_id
        hidden = config.hidden_size
        first, h = layers.head_range(config.num_attention_heads)
        self.num_heads = h
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.rotary_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.head_dim = self.kv_lora_rank + self.rotary_dim
        self.scaling = mla_softmax_scale(config)
        self.interleaved_rope = interleaved_rope
        bias = bool(getattr(config, "attention_bias", False))
        # The factory's projections take the model's full shapes (and split them).
        heads = config.num_attention_heads
        q_out = heads * (self.qk_nope_head_dim + self.rotary_dim)
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        if self.q_lora_rank:
            self.q_a_proj = layers.linear(f"{prefix}.q_a_proj", hidden, self.q_lora_rank, bias)
            self.q_a_layernorm = layers.rms_norm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = layers.linear(f"{prefix}.q_b_proj", self.q_lora_rank, q_out, False)
        else:
            self.q_proj = layers.linear(f"{prefix}.q_proj", hidden, q_out, False)
        self.kv_a_proj_with_mqa = layers.linear(
            f"{prefix}.kv_a_proj_with_mqa", hidden, self.head_dim, bias
        )
        self.kv_a_layernorm = layers.rms_norm(self.kv_lora_rank, LATENT_NORM_EPS)
        per_head = self.qk_nope_head_dim + self.v_head_dim
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, h * per_head, bias=False)
        if h != heads:
            # Under tensor parallelism: this rank's heads' rows of the checkpoint's.
            rows = Shard(0, first * per_head, (first + h) * per_head)
            self.kv_b_proj.tp_shards = {"weight": rows}
        self.o_proj = layers.linear(f"{prefix}.o_proj", heads * self.v_head_dim, hidden, bias)
        self.forms = forms or MLAForms(self.kv_lora_rank, self.qk_nope_head_dim, self.v_head_dim)

    def process_weights_after_loading(self) -> None:
        """Split the loaded `kv_b_proj` into the absorbed W_UK and W_UV (contiguous)."""
        w = self.kv_b_proj.weight.detach()
        w = w.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        self.w_uk = nn.Parameter(w[:, : self.qk_nope_head_dim].contiguous(), requires_grad=False)
        self.w_uv = nn.Parameter(w[:, self.qk_nope_head_dim :].contiguous(), requires_grad=False)
        del self.kv_b_proj

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank:
            return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return self.q_proj(x)

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], backend: AttentionBackend, fb):
        t, h, r, dn = x.shape[0], self.num_heads, self.kv_lora_rank, self.qk_nope_head_dim
        q = self._query(x).view(t, h, dn + self.rotary_dim)
        q_nope, q_rope = q[..., :dn], q[..., dn:]
        ckv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(ckv[:, :r].contiguous())
        k_rope = ckv[:, None, r:]
        rotate = apply_rotary_interleaved if self.interleaved_rope else apply_rotary
        q_rope, k_rope = rotate(q_rope, *rope), rotate(k_rope, *rope)
        form = self.forms.for_step(fb)
        o = form.attend(self, q_nope, q_rope, latent, k_rope, backend, fb)  # [T, H, Dv]
        return self.o_proj(o.reshape(t, h * self.v_head_dim))
