"""The Triton attention backend: paged extend/decode/verify kernels and a Triton KV store."""

from __future__ import annotations

import torch

from radixlm.kernels.base import AttentionBackend
from radixlm.kernels.forward_batch import ForwardBatch, ForwardMode
from radixlm.kernels.fp8 import pool_scales
from radixlm.kernels.triton.decode_attention import decode_attention, num_kv_splits
from radixlm.kernels.triton.extend_attention import extend_attention
from radixlm.kernels.triton.mla_decode import MLA_BLOCK_H, mla_decode_attention
from radixlm.kernels.triton.store_kv import store_kv


class TritonBackend(AttentionBackend):
    """Attention through the Triton kernels of `radixlm.kernels.triton`.

    Metadata per step: extend/verify need the query offsets (qo_indptr, one device prefix
    sum) and the longest extend (one host read, sizing the grid); decode needs only the
    split count, a function of the batch size, so decode metadata never syncs with the host
    and decode steps can be captured in CUDA graphs. Runs on CUDA, or on CPU tensors under
    `TRITON_INTERPRET=1` (the tests). A layer's sliding window is the kernels' `window`
    argument (0 for none).

    V may be narrower than K. On a latent pool (one KV head, V the view of each K row's
    first Dv elements: multi-head latent attention) the store writes K alone and decode
    runs `mla_decode_attention`, which reads each latent row once per block of query
    heads; extend and verify run the general kernels, V read through the view.

    An fp8 pool (`radixlm.kernels.fp8`) is quantized by the store and read as fp8 by the
    kernels, computed in fp32, with the layer's K scale folded into the softmax scale and
    its V scale into the output; the scales are constants, so CUDA graphs capture them.
    """

    supports_cuda_graph = True

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.mode is ForwardMode.DECODE:
            kv_heads = self.kv_pool.k_buffer[0].shape[1]
            self._num_splits = num_kv_splits(fb.batch_size, kv_heads, fb.seq_lens.device)
            return
        lens = fb.extend_seq_lens
        self._qo_indptr = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)])
        self._max_extend_len = int(lens.max())

    @property
    def _mla_decode(self) -> bool:
        """Whether decode runs the MLA kernel: a latent pool of one KV head."""
        return self.latent_values and self.kv_pool.k_buffer[0].shape[1] == 1

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.latent_values:
            k_scale = pool_scales(self.kv_pool, layer_id)[0]
            store_kv(self.kv_pool.k_buffer[layer_id], None, loc, k, None, k_scale)
            return
        k_buf, v_buf = self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]
        store_kv(k_buf, v_buf, loc, k, v, *pool_scales(self.kv_pool, layer_id))

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        k_scale, v_scale = pool_scales(self.kv_pool, layer_id)
        if self._mla_decode:
            # Programs per request and split: the head blocks (a function of the batch
            # size and the model, so CUDA graphs replay the captured split count).
            blocks = -(-q.shape[1] // MLA_BLOCK_H)
            return mla_decode_attention(
                q.contiguous(),
                self.kv_pool.k_buffer[layer_id],
                self.v_head_dim,
                fb.req_to_token,
                fb.req_pool_indices,
                fb.seq_lens,
                self.scaling,
                num_kv_splits(fb.batch_size, blocks, q.device),
                block_h=MLA_BLOCK_H,
                window=self.sliding_windows[layer_id] or 0,
                kv_scale=k_scale,
            )
        return decode_attention(
            q.contiguous(),
            self.kv_pool.k_buffer[layer_id],
            self.kv_pool.v_buffer[layer_id],
            fb.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            self.scaling,
            self._num_splits,
            window=self.sliding_windows[layer_id] or 0,
            k_scale=k_scale,
            v_scale=v_scale,
        )

    def forward_extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        return self._extend(q, layer_id, fb, None, None)

    def forward_verify(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        return self._extend(q, layer_id, fb, fb.custom_mask, fb.mask_indptr)

    def _extend(self, q, layer_id, fb, custom_mask, mask_indptr) -> torch.Tensor:
        k_scale, v_scale = pool_scales(self.kv_pool, layer_id)
        return extend_attention(
            q.contiguous(),
            self.kv_pool.k_buffer[layer_id],
            self.kv_pool.v_buffer[layer_id],
            fb.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            fb.extend_prefix_lens,
            self._qo_indptr,
            self._max_extend_len,
            self.scaling,
            custom_mask,
            mask_indptr,
            window=self.sliding_windows[layer_id] or 0,
            positions=fb.positions,
            k_scale=k_scale,
            v_scale=v_scale,
        )
