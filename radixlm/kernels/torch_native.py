"""The CPU reference attention backend: gathers paged K/V and calls torch SDPA."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels.base import AttentionBackend
from radixlm.kernels.forward_batch import ForwardBatch
from radixlm.kernels.fp8 import dequantize, is_fp8, pool_scales
from radixlm.kernels.sliding_window import causal_window_mask, verify_window_mask, window_keep


class TorchNativeBackend(AttentionBackend):
    """Reference backend (any device torch supports; the default on CPU).

    Extend and verify loop over requests (one SDPA call each: causal mask offset by the
    prefix, or the request's block of the custom tree mask); decode gathers every request's
    K/V into a padded [B, L] block and runs one masked SDPA. Grouped-query attention uses
    SDPA's `enable_gqa`. The Triton and FlashInfer backends must match this one.

    V may be narrower than K (Dv < Dk: multi-head latent attention, whose V is the first
    Dv elements of each latent K row, `latent_values`: gathered once, V sliced from K).

    An fp8 pool (`radixlm.kernels.fp8`) is dequantized as it is gathered (stored value
    times the layer's scale, in float32, then cast to q's dtype) and attended as above:
    the reference the fp8 kernels are tested against.

    A layer with a sliding window (`sliding_windows`) adds the window to those masks: one
    mask per window, built on the first layer of the step that needs it and kept for the
    step's other layers of that window; layers without one build nothing.
    """

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self._seq_lens = fb.seq_lens.tolist()
        self._ext_lens = fb.extend_seq_lens.tolist()
        self._pre_lens = fb.extend_prefix_lens.tolist()
        rows = fb.req_pool_indices
        max_len = max(self._seq_lens)
        positions = torch.arange(max_len, device=fb.seq_lens.device)
        valid = positions[None, :] < fb.seq_lens[:, None]  # [B, L]
        # Positions past a request's length read the zeroed padding slot 0, never stale
        # (possibly non-finite) slots: masked scores are exactly 0, but 0 * NaN is not.
        slots = fb.req_to_token[rows, :max_len].to(torch.int64)
        self._slots = torch.where(valid, slots, 0)
        self._decode_mask = self._padding_mask(valid, max_len)
        self._valid = valid
        #: (mode, window) -> the step's mask for the layers of that window.
        self._window_masks: dict[tuple[str, int], object] = {}

    def _padding_mask(self, valid: torch.Tensor, max_len: int) -> torch.Tensor | None:
        """Additive float mask [B, 1, 1, L] for the decode SDPA, built once per step (SDPA
        would convert a bool mask in every layer); None when no row is padded."""
        if min(self._seq_lens) == max_len:
            return None
        mask = torch.zeros(valid.shape, device=valid.device)
        return mask.masked_fill_(~valid, float("-inf"))[:, None, None, :]

    def forward_extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        window = self.sliding_windows[layer_id]
        if window is None:
            return self._per_request(
                q, layer_id, lambda i, n, s, p: _causal_mask(n, s, p, q.device)
            )
        masks = self._window_masks.get(("extend", window))
        if masks is None:
            lens = zip(self._ext_lens, self._seq_lens, self._pre_lens)
            masks = [causal_window_mask(n, s, p, window, q.device) for n, s, p in lens]
            self._window_masks["extend", window] = masks
        return self._per_request(q, layer_id, lambda i, n, s, p: masks[i])

    def forward_verify(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        offsets = fb.mask_indptr.tolist()
        window = self.sliding_windows[layer_id]
        flat = fb.custom_mask
        if window is not None:
            flat = self._window_masks.get(("verify", window))
            if flat is None:
                flat = self._window_masks["verify", window] = verify_window_mask(fb, window)

        def tree_mask(i: int, n: int, s: int, p: int) -> torch.Tensor:
            return flat[offsets[i] : offsets[i + 1]].view(n, s)

        return self._per_request(q, layer_id, tree_mask)

    def _per_request(self, q: torch.Tensor, layer_id: int, mask_of) -> torch.Tensor:
        """One SDPA per request; `mask_of(i, n, s, p)` -> bool [n, s] or None (causal)."""
        out = q.new_empty(*q.shape[:2], self.v_head_dim)
        start = 0
        for i, (n, s, p) in enumerate(zip(self._ext_lens, self._seq_lens, self._pre_lens)):
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, Dk]
            ki, vi = self._gather_kv(layer_id, self._slots[i, :s], q.dtype)
            ki, vi = ki.transpose(0, 1).unsqueeze(0), vi.transpose(0, 1).unsqueeze(0)
            mask = mask_of(i, n, s, p)
            o = F.scaled_dot_product_attention(
                qi,
                ki,
                vi,
                attn_mask=mask,
                is_causal=mask is None,
                scale=self.scaling,
                enable_gqa=True,
            )
            out[start : start + n] = o[0].transpose(0, 1)
            start += n
        return out

    def _gather_kv(
        self, layer_id: int, slots: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K [*slots.shape, Hkv, Dk] and V [*slots.shape, Hkv, Dv] of `slots` in `dtype`
        (an fp8 pool's dequantized); a latent pool's V is the first Dv elements of the
        gathered K (one gather)."""
        k_buf, v_buf = self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]
        flat = slots.flatten()
        # index_select is several times faster than advanced indexing on CPU.
        k = k_buf.index_select(0, flat).view(*slots.shape, *k_buf.shape[1:])
        v = None if self.latent_values else v_buf.index_select(0, flat)
        if is_fp8(k_buf.dtype):
            k_scale, v_scale = pool_scales(self.kv_pool, layer_id)
            k = dequantize(k, k_scale, dtype)
            v = None if v is None else dequantize(v, v_scale, dtype)
        else:
            k = k.to(dtype)
            v = None if v is None else v.to(dtype)
        if v is None:
            return k, k[..., : self.v_head_dim]
        return k, v.view(*slots.shape, *v_buf.shape[1:])

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        k, v = self._gather_kv(layer_id, self._slots, q.dtype)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, L, Dk], [B, Hkv, L, Dv]
        window = self.sliding_windows[layer_id]
        if window is None:
            mask = self._decode_mask
            if mask is not None and mask.dtype != q.dtype:  # once per step (first layer)
                mask = self._decode_mask = mask.to(q.dtype)
        else:
            mask = self._window_masks.get(("decode", window))
            if mask is None:
                mask = self._window_masks["decode", window] = self._decode_window_mask(
                    window, q.dtype
                )
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), k, v, attn_mask=mask, scale=self.scaling, enable_gqa=True
        )  # [B, H, 1, Dv]
        return o.squeeze(2)

    def _decode_window_mask(self, window: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, 1, L] in `dtype` for a decode layer of window `window`:
        request b's one query (position seq_len - 1) sees its last `window` keys."""
        last = torch.tensor(self._seq_lens, device=self._valid.device) - 1
        keep = self._valid & window_keep(last, self._valid.shape[1], window)
        mask = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
        return mask.masked_fill_(~keep, float("-inf"))[:, None, None, :]


def _causal_mask(n: int, s: int, p: int, device) -> torch.Tensor | None:
    """bool [n, s]: new token j (position p + j) sees keys 0..p + j; None when p == 0."""
    if p == 0:
        return None
    keys = torch.arange(s, device=device)
    return keys[None, :] <= (p + torch.arange(n, device=device))[:, None]
