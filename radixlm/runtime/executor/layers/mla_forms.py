"""The two forms of multi-head latent attention's attention step, and the per-step choice
between them (`MLAForms`); the layer itself is `layers.mla.MLAAttention`.

Shapes: T new tokens, H heads, latent R (`kv_lora_rank`), RoPE key Dr, nope head Dn
(`qk_nope_head_dim`), value head Dv. Every form gets the layer's q_nope [T, H, Dn],
q_rope [T, H, Dr] (rotated), the new tokens' latent [T, R] and RoPE key k_rope [T, 1, Dr]
(rotated), stores the key row [latent ; k_rope] in the latent pool through the backend,
and returns the attention output [T, H, Dv] before `o_proj`.

  * `AbsorbedForm` (every step mode): q = [W_UK^T q_nope ; q_rope] attends through the
    backend as one-KV-head attention over the cached rows, and W_UV maps its [T, H, R]
    output per head (DeepSeek-V2 report, section 2.1.3).
  * `ExpandedStep` (EXTEND steps): the cached latents of each request's prefix and new
    tokens are up-projected per head, k_nope = W_UK c [H, Dn] and v = W_UV c [H, Dv], the
    shared RoPE key is appended to every head's k_nope, and q = [q_nope ; q_rope] attends
    per head (query/key head dim Dn + Dr, value head dim Dv), causally after the prefix,
    by torch SDPA over each request's gathered rows (V zero-padded to the key width, so
    SDPA runs its fused kernel).

Both are exact rewrites of the same attention; they differ in cost. Multiply-adds per
layer for one request of n new tokens after p cached ones (s = p + n keys, P = n * p +
n (n + 1) / 2 causal query-key pairs):
    absorbed = n H Dn R  (fold W_UK into q)  +  P H (R + Dr)  (scores)  +  P H R  (values)
             + n H R Dv  (W_UV on the output)
    expanded = s H R (Dn + Dv)  (up-project every key)  +  P H (Dn + Dr)  +  P H Dv
so absorbed - expanded = H [P (2R - Dn - Dv) - p R (Dn + Dv)]: H and Dr cancel.
`MLAForms` picks the expanded form for an EXTEND step when, summed over its requests,
    sum P_b * (2R - Dn - Dv) > sum p_b * R * (Dn + Dv),
i.e. always for fresh prompts (p = 0) when 2R > Dn + Dv, and after a long prefix
(p >> n) once n exceeds about R (Dn + Dv) / (2R - Dn - Dv) new tokens: 171 for
DeepSeek-V3 (R 512, Dn = Dv = 128). The rule counts multiply-adds only: the expanded
form's extra traffic, writing and reading 2 s H (Dn + Dr + Dv) temporary elements per
request, comes with at least R (Dn + Dv) / (2 (Dn + Dr + Dv)) multiply-adds per element
(205 for DeepSeek-V3), above a CPU's ridge point of tens of FLOPs per byte; the cached
rows and the weights are read by both forms. Decode and verify steps (one or a few
queries per request) stay absorbed: up-projecting every cached key would dominate them.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.kernels import AttentionBackend, ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixlm.runtime.executor.layers.mla import MLAAttention

#: `MLAForms.mode` values: choose per step by cost, or force one form on EXTEND steps.
FORM_MODES = ("auto", "absorbed", "expanded")


class AbsorbedForm:
    """Attention over the latent rows as one-KV-head attention through the backend (module
    docstring); stateless, used for every step mode."""

    def attend(
        self,
        attn: MLAAttention,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        backend: AttentionBackend,
        fb: ForwardBatch,
    ) -> torch.Tensor:
        """Store the key rows and attend; returns [T, H, Dv] in q_nope's dtype."""
        r = attn.kv_lora_rank
        # W_UK^T q_nope per head: [H, T, Dn] @ [H, Dn, R] -> [T, H, R].
        q_abs = torch.bmm(q_nope.transpose(0, 1), attn.w_uk).transpose(0, 1)
        q = torch.cat((q_abs, q_rope), dim=-1)
        k = torch.cat((latent[:, None, :], k_rope), dim=-1)
        o = backend.forward(q, k, k[..., :r], attn.layer_id, fb)  # [T, H, R]
        # W_UV o per head: [H, T, R] @ [H, R, Dv] -> [T, H, Dv].
        return torch.bmm(o.transpose(0, 1), attn.w_uv.transpose(1, 2)).transpose(0, 1)


class ExpandedStep:
    """The expanded form for one EXTEND step (module docstring): built once per step from
    its `ForwardBatch`, then called by every layer.

    Attributes:
        slots: int64 [sum_b s_b], each request's KV slots (prefix, then new tokens) in batch
            order: the rows every layer gathers from its latent pool buffer.
        ext_lens, seq_lens: per request, new tokens n_b and keys s_b.
        masks: per request, bool [n_b, s_b] (new token j sees keys 0 .. p_b + j), or None
            for a request without a cached prefix (plain causal attention).
    """

    def __init__(self, fb: ForwardBatch):
        self.ext_lens = fb.extend_seq_lens.tolist()
        self.seq_lens = fb.seq_lens.tolist()
        pre_lens = fb.extend_prefix_lens.tolist()
        rows = fb.req_pool_indices.tolist()
        table = fb.req_to_token
        slots = [table[row, :s] for row, s in zip(rows, self.seq_lens)]
        self.slots = torch.cat(slots).to(torch.int64)
        device = table.device
        self.masks = [
            None
            if p == 0
            else torch.arange(n + p, device=device)[None, :]
            <= (p + torch.arange(n, device=device))[:, None]
            for n, p in zip(self.ext_lens, pre_lens)
        ]

    def attend(
        self,
        attn: MLAAttention,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        backend: AttentionBackend,
        fb: ForwardBatch,
    ) -> torch.Tensor:
        """Store the key rows, up-project every request's cached latents per head and
        attend; returns [T, H, Dv] in q_nope's dtype."""
        r, h, dn, dv = attn.kv_lora_rank, attn.num_heads, attn.qk_nope_head_dim, attn.v_head_dim
        k = torch.cat((latent[:, None, :], k_rope), dim=-1)
        backend.set_kv(attn.layer_id, fb.out_cache_loc, k, k[..., :r])
        rows = backend.kv_pool.k_buffer[attn.layer_id].index_select(0, self.slots)[:, 0]
        rows = rows.to(q_nope.dtype)  # [S, R + Dr]
        c, kr = rows[:, :r], rows[:, r:]
        s_all = rows.shape[0]
        k_nope = F.linear(c, attn.w_uk.view(h * dn, r)).view(s_all, h, dn)
        v = F.linear(c, attn.w_uv.view(h * dv, r)).view(s_all, h, dv)
        keys = torch.cat((k_nope, kr[:, None, :].expand(s_all, h, kr.shape[-1])), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)  # [T, H, Dn + Dr]
        if dv < keys.shape[-1]:
            # SDPA's fused kernels want V as wide as K (else its math path, several times
            # slower): zero columns add nothing to the output, which drops them again.
            v = F.pad(v, (0, keys.shape[-1] - dv))
        out = q.new_empty(q.shape[0], h, dv)
        q_start = k_start = 0
        for n, s, mask in zip(self.ext_lens, self.seq_lens, self.masks):
            # A leading batch dim: 3-D inputs take a several times slower path on CPU.
            o = F.scaled_dot_product_attention(
                q[None, q_start : q_start + n].transpose(1, 2),
                keys[None, k_start : k_start + s].transpose(1, 2),
                v[None, k_start : k_start + s].transpose(1, 2),
                attn_mask=mask,
                is_causal=mask is None,
                scale=attn.scaling,
            )  # [1, H, n, max(Dv, Dn + Dr)]
            out[q_start : q_start + n] = o[0, ..., :dv].transpose(0, 1)
            q_start, k_start = q_start + n, k_start + s
        return out


ABSORBED = AbsorbedForm()


class MLAForms:
    """Which form each step's MLA layers run, shared by every layer of a model.

    Args:
        kv_lora_rank, qk_nope_head_dim, v_head_dim: the model's R, Dn and Dv.
        mode: "auto" (EXTEND steps by the cost rule of the module docstring), "absorbed"
            or "expanded" (every EXTEND step); decode and verify steps are always absorbed.
            Raises ValueError for another mode. `mode` may be reassigned between steps.

    `for_step(fb)` returns the form object whose `attend(attn, q_nope, q_rope, latent,
    k_rope, backend, fb)` a layer calls; the first layer of a step decides, the step's
    other layers (called with the same `fb` object) reuse the decision and the expanded
    form's per-step tables.
    """

    def __init__(self, kv_lora_rank: int, qk_nope_head_dim: int, v_head_dim: int, mode="auto"):
        self.mode = mode
        #: Multiply-adds the expanded form saves per query-key pair (2R - Dn - Dv) and
        #: spends per cached prefix key (R (Dn + Dv)), each over H.
        self.pair_saving = 2 * kv_lora_rank - qk_nope_head_dim - v_head_dim
        self.prefix_cost = kv_lora_rank * (qk_nope_head_dim + v_head_dim)
        self._step: weakref.ref | None = None
        self._form: AbsorbedForm | ExpandedStep = ABSORBED

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in FORM_MODES:
            raise ValueError(f"MLA attention form must be one of {FORM_MODES}, got {value!r}")
        self._mode = value
        self._step = None

    def expanded_cheaper(self, ext_lens: list[int], pre_lens: list[int]) -> bool:
        """Whether the expanded form takes fewer multiply-adds for requests of `ext_lens`
        new tokens after `pre_lens` cached ones (module docstring)."""
        pairs = sum(n * p + n * (n + 1) // 2 for n, p in zip(ext_lens, pre_lens))
        return pairs * self.pair_saving > sum(pre_lens) * self.prefix_cost

    def for_step(self, fb: ForwardBatch) -> AbsorbedForm | ExpandedStep:
        """The form of this step (see the class docstring)."""
        if fb.mode is not ForwardMode.EXTEND or self._mode == "absorbed":
            return ABSORBED
        if self._step is not None and self._step() is fb:
            return self._form
        expanded = self._mode == "expanded" or self.expanded_cheaper(
            fb.extend_seq_lens.tolist(), fb.extend_prefix_lens.tolist()
        )
        self._form = ExpandedStep(fb) if expanded else ABSORBED
        self._step = weakref.ref(fb)
        return self._form
