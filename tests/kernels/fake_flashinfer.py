"""A torch stand-in for the two FlashInfer wrappers radixlm uses, written from FlashInfer's
documented semantics (NHD paged cache, CSR page table, bottom-right causal alignment, flat
row-major custom mask), with its keyword names, so the FlashInfer backend's plumbing can
be tested on CPU. `window_left` w >= 0 hides from the query at (bottom-right aligned)
position i the keys before i - w. It checks the layout it is given; it says nothing about
FlashInfer's kernels themselves (the gpu-marked tests do)."""

from __future__ import annotations

import types

import torch


class _Paged:
    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
    ):
        assert kv_layout == "NHD"
        self.graph = use_cuda_graph
        self.buffers = (
            paged_kv_indptr_buffer,
            paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer,
        )
        if use_cuda_graph:
            assert all(b is not None for b in self.buffers)
        self.qo_indptr = None
        self.mask = None
        self.causal = False
        self.window_left = -1

    def _plan_kv(self, indptr, indices, last, heads, kv_heads, head_dim, page_size, scale):
        for t in (indptr, indices, last):
            assert t.dtype == torch.int32
        assert bool((last >= 1).all()) and bool((last <= page_size).all())
        if self.graph:
            indptr_buf, indices_buf, last_buf = self.buffers
            assert indptr.numel() == indptr_buf.numel(), "graph batch size is fixed"
            assert indices.numel() <= indices_buf.numel()
            indptr_buf.copy_(indptr)
            indices_buf[: indices.numel()].copy_(indices)
            last_buf.copy_(last)
        self.kv = (indptr.tolist(), indices.tolist(), last.tolist())
        self.shape = (heads, kv_heads, head_dim, page_size)
        self.scale = head_dim**-0.5 if scale is None else scale

    def _attend(self, q: torch.Tensor, cache, qo_indptr: list[int]) -> torch.Tensor:
        k_cache, v_cache = cache
        heads, kv_heads, head_dim, page_size = self.shape
        assert k_cache.shape[1:] == (page_size, kv_heads, head_dim)
        indptr, indices, last = self.kv
        out = torch.empty_like(q)
        mask_at = 0
        for b in range(len(indptr) - 1):
            pages = torch.tensor(indices[indptr[b] : indptr[b + 1]])
            kv_len = (len(pages) - 1) * page_size + last[b]
            keys = k_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len]
            vals = v_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len]
            keys = keys.repeat_interleave(heads // kv_heads, 1).float()
            vals = vals.repeat_interleave(heads // kv_heads, 1).float()
            lo, hi = qo_indptr[b], qo_indptr[b + 1]
            n = hi - lo
            scores = torch.einsum("nhd,khd->hnk", q[lo:hi].float(), keys) * self.scale
            keys, pos = torch.arange(kv_len), kv_len - n + torch.arange(n)
            visible = torch.ones(n, kv_len, dtype=torch.bool)
            if self.mask is not None:
                visible = self.mask[mask_at : mask_at + n * kv_len].view(n, kv_len)
                mask_at += n * kv_len
            elif self.causal:
                visible = keys[None, :] <= pos[:, None]
            if self.window_left >= 0:
                visible = visible & (keys[None, :] >= pos[:, None] - self.window_left)
            scores = scores.masked_fill(~visible[None], float("-inf"))
            out[lo:hi] = torch.einsum("hnk,khd->nhd", scores.softmax(-1), vals).to(q.dtype)
        return out


class BatchDecodeWithPagedKVCacheWrapper(_Paged):
    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
    ):
        assert pos_encoding_mode == "NONE"
        self.window_left = window_left
        self._plan_kv(
            indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
            sm_scale,
        )  # fmt: skip

    def run(self, q, paged_kv_cache):
        return self._attend(q, paged_kv_cache, list(range(q.shape[0] + 1)))


class BatchPrefillWithPagedKVCacheWrapper(_Paged):
    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking=True,
    ):
        assert qo_indptr.dtype == torch.int32
        self._plan_kv(
            paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
            num_kv_heads, head_dim_qk, page_size, sm_scale,
        )  # fmt: skip
        self.qo_indptr = qo_indptr.tolist()
        self.mask = None if custom_mask is None else custom_mask.to(torch.bool)
        self.causal = causal
        self.window_left = window_left

    def run(self, q, paged_kv_cache):
        return self._attend(q, paged_kv_cache, self.qo_indptr)


def module() -> types.ModuleType:
    """A module object to install as `sys.modules['flashinfer']`."""
    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    mod.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    return mod
