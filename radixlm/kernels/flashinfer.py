"""The FlashInfer attention backend (CUDA only; the optional extra `radixlm[gpu]`).

FlashInfer's wrappers are planned once per step in `init_forward_metadata` and reused by
every layer: `BatchDecodeWithPagedKVCacheWrapper` for decode, and
`BatchPrefillWithPagedKVCacheWrapper` for extend (causal) and for tree verification (its
`custom_mask`, the same flat row-major per-request layout as `ForwardBatch.custom_mask`).

The pool's per-layer buffers [num_slots, Hkv, D] are viewed as FlashInfer's NHD paged
cache [num_slots / page_size, page_size, Hkv, D]; request b's pages are
req_to_token[row_b, 0 : seq_len_b : page_size] // page_size, valid because the allocator
puts position p at offset p % page_size of its page. `flashinfer` is imported only when
the backend is built, so this module imports without it and without CUDA.

Sliding windows: a wrapper is planned with one `window_left` (W - 1: the query at
position i sees keys i - W + 1 .. i; -1 for none), so the backend keeps one wrapper per
distinct window among the layers (Gemma 3: two) and each layer runs the wrapper of its
own. Tree verification folds the window into the custom mask instead
(`sliding_window.verify_window_mask`, by the tokens' positions), as FlashInfer would
place the drafts by their index.
"""

from __future__ import annotations

import torch

from radixlm.kernels.base import AttentionBackend
from radixlm.kernels.forward_batch import ForwardBatch, ForwardMode
from radixlm.kernels.sliding_window import verify_window_mask

#: Float workspace shared by the wrappers (FlashInfer's examples use 128 MB).
WORKSPACE_BYTES = 256 * 1024 * 1024


def paged_kv_layout(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's CSR page table for a batch.

    Args:
        req_to_token: int32 [rows, context]; req_pool_indices, seq_lens: int64 [B], seq_len >= 1.
        page_size: slots per page.
    Returns:
        kv_indptr int32 [B + 1] (prefix sum of pages per request), kv_indices int32
        [total pages] (page ids, request by request), kv_last_page_len int32 [B] in
        [1, page_size].
    """
    pages = (seq_lens + page_size - 1) // page_size
    indptr = torch.zeros(pages.numel() + 1, dtype=torch.int32, device=seq_lens.device)
    torch.cumsum(pages, 0, out=indptr[1:])
    max_pages = int(pages.max())
    cols = torch.arange(max_pages, device=seq_lens.device)
    first_slots = req_to_token[req_pool_indices[:, None], (cols * page_size)[None, :]]
    valid = cols[None, :] < pages[:, None]
    indices = (first_slots[valid] // page_size).to(torch.int32)
    last_page_len = (seq_lens - (pages - 1) * page_size).to(torch.int32)
    return indptr, indices, last_page_len


class FlashInferBackend(AttentionBackend):
    """Attention through FlashInfer's paged prefill/decode wrappers.

    Args:
        kv_pool, scaling, sliding_windows: as `AttentionBackend`.
        num_heads: query heads. page_size: slots per KV page. dtype: query dtype.
    Raises ImportError when flashinfer is missing (the registry checks first), ValueError
    for a pool whose V rows are not its K rows' shape (Dv != Dk, e.g. multi-head latent
    attention's latent pool): FlashInfer's MLA wrapper takes the latent and rope parts as
    separate paged caches and is not wired here; the triton backend serves such pools.
    """

    supports_cuda_graph = True

    def __init__(
        self,
        kv_pool,
        scaling: float,
        num_heads: int,
        page_size: int = 1,
        dtype: torch.dtype | None = None,
        sliding_windows=None,
    ):
        k0, v0 = kv_pool.k_buffer[0], kv_pool.v_buffer[0]
        if v0.shape != k0.shape:
            raise ValueError(
                f"the flashinfer backend needs V rows shaped like K rows, got K "
                f"{tuple(k0.shape[1:])} and V {tuple(v0.shape[1:])} (multi-head latent "
                "attention?); use --attention-backend triton"
            )
        import flashinfer

        super().__init__(kv_pool, scaling, sliding_windows)
        self.page_size = page_size
        self.num_heads = num_heads
        self.num_kv_heads, self.head_dim = k0.shape[1], k0.shape[2]
        self.q_dtype = dtype or k0.dtype
        self.kv_dtype = k0.dtype
        # Tensor-core decode (prefill kernels) takes any group size and pays off for large
        # groups; the CUDA-core decode kernels are kept for the small power-of-two groups.
        self._tensor_cores = num_heads // self.num_kv_heads not in (1, 2, 4)
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=k0.device)
        self._fi = flashinfer
        #: The layers' distinct windows (None: full attention): one wrapper of each kind
        #: per window, all sharing the workspace (they run one after another).
        self._windows = list(dict.fromkeys(self.sliding_windows))
        self._prefill = {
            w: flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            for w in self._windows
        }
        self._eager_decode = {w: self._new_decode_wrapper() for w in self._windows}
        self._decode = self._eager_decode
        #: batch size -> window -> graph decode wrapper (the windows' share the buffers).
        self._graph_decode: dict[int, dict] = {}

    def _new_decode_wrapper(self, **graph_buffers):
        return self._fi.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace,
            "NHD",
            use_tensor_cores=self._tensor_cores,
            use_cuda_graph=bool(graph_buffers),
            **graph_buffers,
        )

    def _kv_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (-1, self.page_size, self.num_kv_heads, self.head_dim)
        return (
            self.kv_pool.k_buffer[layer_id].view(shape),
            self.kv_pool.v_buffer[layer_id].view(shape),
        )

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        layout = paged_kv_layout(fb.req_to_token, fb.req_pool_indices, fb.seq_lens, self.page_size)
        if fb.mode is ForwardMode.DECODE:
            self._decode = self._eager_decode
            self._plan_decode(self._decode, layout)
            return
        lens = fb.extend_seq_lens
        qo_indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
        torch.cumsum(lens, 0, out=qo_indptr[1:])
        verify = fb.mode is ForwardMode.TARGET_VERIFY
        for window, wrapper in self._prefill.items():
            mask = None
            if verify:
                mask = fb.custom_mask if window is None else verify_window_mask(fb, window)
            wrapper.plan(
                qo_indptr,
                *layout,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                custom_mask=mask,
                causal=not verify,
                sm_scale=self.scaling,
                window_left=_window_left(None if verify else window),
                q_data_type=self.q_dtype,
                kv_data_type=self.kv_dtype,
            )

    def _plan_decode(self, wrappers: dict, layout) -> None:
        for window, wrapper in wrappers.items():
            wrapper.plan(
                *layout,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                pos_encoding_mode="NONE",
                window_left=_window_left(window),
                sm_scale=self.scaling,
                q_data_type=self.q_dtype,
                kv_data_type=self.kv_dtype,
            )

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        device = self._workspace.device
        max_pages = -(-max_context_len // self.page_size)
        self._g_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self._g_indices = torch.zeros(max_bs * max_pages, dtype=torch.int32, device=device)
        self._g_last = torch.ones(max_bs, dtype=torch.int32, device=device)

    def init_forward_metadata_cuda_graph(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        wrappers = self._graph_decode.get(bs)
        if wrappers is None:
            buffers = dict(
                paged_kv_indptr_buffer=self._g_indptr[: bs + 1],
                paged_kv_indices_buffer=self._g_indices,
                paged_kv_last_page_len_buffer=self._g_last[:bs],
            )
            wrappers = {w: self._new_decode_wrapper(**buffers) for w in self._windows}
            self._graph_decode[bs] = wrappers
        self._decode = wrappers
        self._plan_decode(
            wrappers,
            paged_kv_layout(fb.req_to_token, fb.req_pool_indices, fb.seq_lens, self.page_size),
        )

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        wrapper = self._decode[self.sliding_windows[layer_id]]
        return wrapper.run(q.contiguous(), self._kv_cache(layer_id))

    def forward_extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        wrapper = self._prefill[self.sliding_windows[layer_id]]
        return wrapper.run(q.contiguous(), self._kv_cache(layer_id))

    def forward_verify(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        return self.forward_extend(q, layer_id, fb)


def _window_left(window: int | None) -> int:
    """FlashInfer's `window_left` for a sliding window of `window` keys (-1: none)."""
    return -1 if window is None else window - 1
