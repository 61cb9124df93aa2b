"""The CPU attention backend: decode and extend by radixlm's kernels, verify by torch_native.

Decode reads each request's K/V in place from the pool through its slot list
(`radixlm/kernels/cpu/decode_attention.c`) instead of gathering them into a padded
block for SDPA; extend runs FlashAttention-style blocks over the slot list
(`extend_attention.c`; head_dim a multiple of 16, else torch_native's SDPA). float32,
float16 or fp8 pools (`--kv-cache-dtype float16`: half the KV bytes, fp8_e4m3 / fp8_e5m2:
a quarter; computed in fp32, an fp8 layer's K scale folded into the softmax scale and its
V scale applied to the output, `radixlm.kernels.fp8`);
`create_attention_backend` falls back to torch_native where the CPU kernels cannot be
built or the pool's dtype or shape is outside them (`supports_pool`).

A pool whose V rows differ from its K rows (Dv != Dk, or V a view of K's first Dv
elements: multi-head latent attention) decodes through `decode_attention_mla.c`, which
reads each latent row once for all query heads; its K/V store is the pool's own `set_kv`,
and the fused decode-layer stack is not offered it.
"""

from __future__ import annotations

import torch

from radixlm.kernels.base import FusedLayerTables
from radixlm.kernels.cpu import KV_DTYPES, CpuKernels
from radixlm.kernels.forward_batch import ForwardBatch, ForwardMode
from radixlm.kernels.fp8 import is_fp8, pool_scales
from radixlm.kernels.torch_native import TorchNativeBackend


def supports_pool(kv_pool, num_heads: int | None) -> bool:
    """Whether the C kernels can serve this pool: float32, float16 or fp8 CPU buffers, K and V
    head dims multiples of 8, each slot's V heads contiguous (V may be a view of K), and
    (when known) the query heads a multiple of the KV heads."""
    k, v = kv_pool.k_buffer[0], kv_pool.v_buffer[0]
    return (
        k.dtype in KV_DTYPES
        and k.device.type == "cpu"
        and k.is_contiguous()
        and k.shape[2] % 8 == 0
        and v.dtype == k.dtype
        and v.shape[2] % 8 == 0
        and v.stride(2) == 1
        and (v.shape[1] == 1 or v.stride(1) == v.shape[2])
        and (num_heads is None or num_heads % k.shape[1] == 0)
    )


class CpuNativeBackend(TorchNativeBackend):
    """TorchNativeBackend whose `forward_decode` and `forward_extend` run the C attention
    kernels (extend: when head_dim % 16 == 0, chosen once here) and whose `set_kv` copies
    the new K/V rows in one C call (an fp8 pool's own `set_kv` quantizes them). Sliding
    windows go to the kernels as their `window` argument (0 for a layer without one);
    verify runs torch_native's masks.

    Args:
        kv_pool, scaling, sliding_windows: as `AttentionBackend`; the pool's buffers
            float32, float16, or fp8 with per-layer `kv_scales`.
        kernels: the loaded `CpuKernels`.
    """

    def __init__(self, kv_pool, scaling: float, kernels: CpuKernels, sliding_windows=None):
        super().__init__(kv_pool, scaling, sliding_windows)
        #: Each layer's window as the kernels take it (0: none).
        self._windows = [w or 0 for w in self.sliding_windows]
        self.kernels = kernels
        #: Whether extend attention runs the C kernel (K and V head dims % 16 == 0).
        self.extend_kernel = self.k_head_dim % 16 == 0 and self.v_head_dim % 16 == 0
        #: Whether K and V rows are alike and packed: the C store and the fused stack.
        self.plain_pool = kv_pool.v_buffer[0].shape == kv_pool.k_buffer[0].shape and all(
            b.is_contiguous() for b in (kv_pool.k_buffer[0], kv_pool.v_buffer[0])
        )
        #: Whether the pool stores fp8 (written by its own `set_kv`, never by the fused stack).
        self.fp8 = is_fp8(kv_pool.k_buffer[0].dtype)
        if self.extend_kernel:
            self.forward_extend = self._extend_kernel

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        super().init_forward_metadata(fb)
        self._lens = fb.seq_lens.to(torch.int64)
        self._ext = fb.extend_seq_lens.to(torch.int64)

    def _extend_kernel(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """forward_extend by the C kernel: q [T, H, Dk] -> [T, H, Dv] in q's dtype."""
        k_buf, v_buf = self._layer_kv(layer_id)
        k_scale, v_scale = pool_scales(self.kv_pool, layer_id)
        out = self.kernels.extend_attention(
            q.float(), k_buf, v_buf, self._slots, self._lens, self._ext, self.scaling * k_scale,
            self._windows[layer_id],
        )  # fmt: skip
        return _scaled(out, v_scale).to(q.dtype)

    def _layer_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V buffers, float32, float16 or fp8 [num_slots, Hkv, Dk / Dv]."""
        return self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]

    def _padding_mask(self, valid: torch.Tensor, max_len: int) -> None:
        """The C decode kernel stops at each request's length: no mask to build."""
        return None

    def fused_decode_tables(self, fb: ForwardBatch) -> FusedLayerTables | None:
        """Tables for `CpuKernels.decode_layers`: every DECODE step, and every causal
        EXTEND or TARGET_VERIFY step (`causal_step`) when extend attention runs the C
        kernel (`ext_lens` None when each request has one new token: the decode kernel
        serves it). None otherwise (tree-masked verifies, head_dim % 16 != 0, pools whose V
        rows are not K's shape packed, e.g. latent pools, fp8 pools, whose scales and
        quantizing store the stack lacks, and every step when a layer has a sliding window:
        the fused stack has no window argument)."""
        if self.has_windows or not self.plain_pool or self.fp8:
            return None
        if fb.mode is ForwardMode.DECODE:
            ext_lens = None
        elif self.extend_kernel and causal_step(fb):
            ext_lens = self._ext
            if fb.out_cache_loc.shape[0] == ext_lens.shape[0]:
                ext_lens = None
        else:
            return None
        pool = self.kv_pool
        return FusedLayerTables(
            pool.k_buffer, pool.v_buffer, self._slots, self._lens, ext_lens, self.scaling
        )

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if not self.plain_pool or self.fp8:  # the pool knows what it stores (latent: K alone)
            self.kv_pool.set_kv(layer_id, loc, k, v)
            return
        self.kernels.store_kv(k.float(), v.float(), *self._layer_kv(layer_id), loc)

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        k_buf, v_buf = self._layer_kv(layer_id)
        k_scale, v_scale = pool_scales(self.kv_pool, layer_id)
        out = self.kernels.decode_attention(
            q.float(), k_buf, v_buf, self._slots, self._lens, self.scaling * k_scale,
            self._windows[layer_id],
        )  # fmt: skip
        return _scaled(out, v_scale).to(q.dtype)


def _scaled(out: torch.Tensor, v_scale: float) -> torch.Tensor:
    """The kernels' output (float32) times an fp8 layer's V scale, in place (1.0: as is)."""
    return out if v_scale == 1.0 else out.mul_(v_scale)


def causal_step(fb: ForwardBatch) -> bool:
    """Whether every new token of this EXTEND or TARGET_VERIFY step sees exactly its
    request's cached prefix and the new tokens up to itself: always for EXTEND (chain-draft
    verifies arrive as EXTEND too), and for a TARGET_VERIFY step whose masks are causal
    (a draft model's tree steps may be)."""
    if fb.mode is ForwardMode.EXTEND:
        return True
    if fb.mode is not ForwardMode.TARGET_VERIFY or fb.custom_mask is None:
        return False
    offset = 0
    for pre, n in zip(fb.extend_prefix_lens.tolist(), fb.extend_seq_lens.tolist()):
        mask = fb.custom_mask[offset : offset + n * (pre + n)].view(n, pre + n)
        offset += n * (pre + n)
        chain = torch.ones(n, n, dtype=torch.bool).tril_()
        if not (bool(mask[:, :pre].all()) and torch.equal(mask[:, pre:], chain)):
            return False
    return True
