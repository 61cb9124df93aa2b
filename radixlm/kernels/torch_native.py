"""The CPU reference attention backend: gathers paged K/V and calls torch SDPA."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels.base import AttentionBackend
from radixlm.kernels.forward_batch import ForwardBatch


class TorchNativeBackend(AttentionBackend):
    """Reference backend (any device torch supports; the default on CPU).

    Extend loops over requests (one SDPA call each, causal mask offset by the prefix);
    decode gathers every request's K/V into a padded [B, L] block and runs one masked SDPA.
    Grouped-query attention uses SDPA's `enable_gqa`.
    """

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self._seq_lens = fb.seq_lens.tolist()
        self._ext_lens = fb.extend_seq_lens.tolist()
        self._pre_lens = fb.extend_prefix_lens.tolist()
        rows = fb.req_pool_indices
        max_len = max(self._seq_lens)
        valid = torch.arange(max_len)[None, :] < fb.seq_lens[:, None]  # [B, L]
        # Positions past a request's length read the zeroed padding slot 0, never stale
        # (possibly non-finite) slots: masked scores are exactly 0, but 0 * NaN is not.
        slots = fb.req_to_token[rows, :max_len].to(torch.int64)
        self._slots = torch.where(valid, slots, 0)
        self._decode_mask = valid[:, None, None, :]

    def forward_extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        k_buf = self.kv_pool.k_buffer[layer_id]
        v_buf = self.kv_pool.v_buffer[layer_id]
        out = torch.empty_like(q)
        start = 0
        for i, (n, s, p) in enumerate(zip(self._ext_lens, self._seq_lens, self._pre_lens)):
            slots = self._slots[i, :s]
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            ki = k_buf.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)
            vi = v_buf.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)
            if p == 0:
                o = F.scaled_dot_product_attention(
                    qi, ki, vi, is_causal=True, scale=self.scaling, enable_gqa=True
                )
            else:
                mask = torch.arange(s)[None, :] <= (p + torch.arange(n))[:, None]
                o = F.scaled_dot_product_attention(
                    qi, ki, vi, attn_mask=mask, scale=self.scaling, enable_gqa=True
                )
            out[start : start + n] = o[0].transpose(0, 1)
            start += n
        return out

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        shape = (*self._slots.shape, *self.kv_pool.k_buffer[layer_id].shape[1:])
        flat = self._slots.flatten()
        # index_select is several times faster than advanced indexing on CPU.
        k_buf, v_buf = self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]
        k = k_buf.index_select(0, flat).view(shape).to(q.dtype).transpose(1, 2)  # [B, Hkv, L, D]
        v = v_buf.index_select(0, flat).view(shape).to(q.dtype).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), k, v, attn_mask=self._decode_mask, scale=self.scaling, enable_gqa=True
        )  # [B, H, 1, D]
        return o.squeeze(2)
