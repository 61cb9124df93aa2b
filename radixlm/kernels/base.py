"""The attention-backend interface every backend implements (torch_native, triton, flashinfer).

The model calls `backend.forward(q, k, v, layer_id, forward_batch)` and never branches on
the backend; the backend stores the new K/V into the KV pool and attends over the
request's whole sequence read through the request-to-token table.

Per step the caller (ModelRunner) calls `init_forward_metadata(fb)` once before the layers
run; every layer then reuses that metadata. Under CUDA graphs the runner instead calls
`init_cuda_graph_state(max_bs, max_context_len)` once, and
`init_forward_metadata_cuda_graph(fb)` before capturing and before every replay, outside
the graph, with the graph's static batch.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import NamedTuple

import torch

from radixlm.kernels.forward_batch import ForwardBatch, ForwardMode
from radixlm.kernels.sliding_window import layer_windows


def latent_value_view(k_buf: torch.Tensor, v_buf: torch.Tensor) -> bool:
    """Whether `v_buf` [num_slots, Hkv, Dv] is a view of the first Dv elements of each row of
    `k_buf` [num_slots, Hkv, Dk] (same memory and row strides, Dv < Dk): a latent pool,
    whose `set_kv` writes K alone."""
    return (
        v_buf.data_ptr() == k_buf.data_ptr()
        and v_buf.shape[:-1] == k_buf.shape[:-1]
        and v_buf.stride() == k_buf.stride()
        and v_buf.shape[-1] < k_buf.shape[-1]
    )


class FusedLayerTables(NamedTuple):
    """What a fused layer stack (one kernel running every decoder layer of a step, e.g.
    `CpuKernels.decode_layers`) needs to do this step's attention itself.

    Attributes:
        k_buffers, v_buffers: the pool's per-layer K/V buffers [num_slots, Hkv, D].
        slots: int64 [B, max_len], each request's KV slots in sequence order.
        seq_lens: int64 [B], tokens per request including the new ones.
        ext_lens: int64 [B] new tokens per request (causal extend attention), or None when
            every request has one new token (decode attention).
        scaling: the softmax scale.
    """

    k_buffers: list[torch.Tensor]
    v_buffers: list[torch.Tensor]
    slots: torch.Tensor
    seq_lens: torch.Tensor
    ext_lens: torch.Tensor | None
    scaling: float


class AttentionBackend(abc.ABC):
    """Paged attention over a `KVPool`-like object with `k_buffer`, `v_buffer`, `set_kv`.

    Args:
        kv_pool: object exposing per-layer `k_buffer[l]` [num_slots, num_kv_heads, Dk],
            `v_buffer[l]` [num_slots, num_kv_heads, Dv] and `set_kv(layer, loc, k, v)`.
            Dv may differ from Dk, and `v_buffer[l]` may be a strided view of the first Dv
            elements of each `k_buffer[l]` row (a latent pool: multi-head latent attention
            in absorbed form, `latent_value_view`; docs/kernels.md).
        scaling: softmax scale, normally head_dim ** -0.5.
        sliding_windows: one entry per layer (len(kv_pool.k_buffer)): the layer's
            sliding window W (the query at position i sees keys i - W + 1 .. i;
            `radixlm.kernels.sliding_window`) or None for full causal attention; None
            means no window anywhere. Raises ValueError on a wrong length or W < 1.
    """

    #: Whether decode steps may be captured in CUDA graphs (metadata without host syncs).
    supports_cuda_graph: bool = False

    def __init__(
        self, kv_pool, scaling: float, sliding_windows: Sequence[int | None] | None = None
    ):
        self.kv_pool = kv_pool
        self.scaling = scaling
        #: tuple[int | None, ...], one window per layer (None: full causal attention).
        self.sliding_windows = layer_windows(sliding_windows, len(kv_pool.k_buffer))
        #: Whether any layer has a window.
        self.has_windows = any(w is not None for w in self.sliding_windows)
        k0, v0 = kv_pool.k_buffer[0], kv_pool.v_buffer[0]
        #: Key and value head dims (Dk, Dv); they differ for multi-head latent attention.
        self.k_head_dim, self.v_head_dim = k0.shape[-1], v0.shape[-1]
        #: Whether each V buffer is the first Dv elements of its K buffer's rows.
        self.latent_values = latent_value_view(k0, v0)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:  # noqa: B027
        """Prepare per-step metadata once, before the layers run (default: nothing)."""

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:  # noqa: B027
        """Allocate static metadata buffers for decode graphs of up to `max_bs` requests of
        up to `max_context_len` tokens (default: nothing)."""

    def init_forward_metadata_cuda_graph(self, fb: ForwardBatch) -> None:
        """Metadata for a captured decode batch; runs outside the graph (default: eager)."""
        self.init_forward_metadata(fb)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch
    ) -> torch.Tensor:
        """Store k, v and attend.

        Args:
            q: [T, num_heads, Dk]; k: [T, num_kv_heads, Dk]; v: [T, num_kv_heads, Dv]
                (RoPE applied).
        Returns:
            [T, num_heads, Dv] attention output in q's dtype.
        """
        self.set_kv(layer_id, fb.out_cache_loc, k, v)
        if fb.mode is ForwardMode.DECODE:
            return self.forward_decode(q, layer_id, fb)
        if fb.mode is ForwardMode.TARGET_VERIFY:
            return self.forward_verify(q, layer_id, fb)
        return self.forward_extend(q, layer_id, fb)

    def fused_decode_tables(self, fb: ForwardBatch) -> FusedLayerTables | None:
        """The tables a fused layer stack needs to run this step's attention inside its own
        kernel, or None when this backend cannot hand the step over (the default): the
        stack then runs the layers one by one through `forward`. Call after
        `init_forward_metadata(fb)`."""
        return None

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K/V into the pool (default: the pool's own `set_kv`)."""
        self.kv_pool.set_kv(layer_id, loc, k, v)

    @abc.abstractmethod
    def forward_extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """Causal attention of new tokens over prefix + new tokens of each request."""

    @abc.abstractmethod
    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """Attention of one new token per request over its whole sequence."""

    @abc.abstractmethod
    def forward_verify(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """Attention of draft tokens over prefix + drafts under `fb.custom_mask` (a tree)."""
