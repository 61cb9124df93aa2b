"""The CPU attention backend: decode and extend by radixlm's kernels, verify by torch_native.

Decode reads each request's K/V in place from the pool through its slot list
(`radixlm/kernels/cpu/decode_attention.c`) instead of gathering them into a padded
block for SDPA; extend runs FlashAttention-style blocks over the slot list
(`extend_attention.c`; head_dim a multiple of 16, else torch_native's SDPA). float32 or
float16 pools (`--kv-cache-dtype float16`: half the KV bytes, computed in fp32);
`create_attention_backend` falls back to torch_native where the CPU kernels cannot be
built or the pool's dtype or shape is outside them (`supports_pool`).
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu import KV_DTYPES, CpuKernels
from radixlm.kernels.forward_batch import ForwardBatch
from radixlm.kernels.torch_native import TorchNativeBackend


def supports_pool(kv_pool, num_heads: int | None) -> bool:
    """Whether the C kernels can serve this pool: float32 or float16 CPU buffers, head_dim a
    multiple of 8, and (when known) the query heads a multiple of the KV heads."""
    k = kv_pool.k_buffer[0]
    return (
        k.dtype in KV_DTYPES
        and k.device.type == "cpu"
        and k.shape[2] % 8 == 0
        and (num_heads is None or num_heads % k.shape[1] == 0)
    )


class CpuNativeBackend(TorchNativeBackend):
    """TorchNativeBackend whose `forward_decode` and `forward_extend` run the C attention
    kernels (extend: when head_dim % 16 == 0, chosen once here) and whose `set_kv` copies
    the new K/V rows in one C call.

    Args:
        kv_pool, scaling: as `AttentionBackend`; the pool's buffers float32 or float16.
        kernels: the loaded `CpuKernels`.
    """

    def __init__(self, kv_pool, scaling: float, kernels: CpuKernels):
        super().__init__(kv_pool, scaling)
        self.kernels = kernels
        #: Whether extend attention runs the C kernel (head_dim % 16 == 0).
        self.extend_kernel = kv_pool.k_buffer[0].shape[2] % 16 == 0
        if self.extend_kernel:
            self.forward_extend = self._extend_kernel

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        super().init_forward_metadata(fb)
        self._lens = fb.seq_lens.to(torch.int64)
        self._ext = fb.extend_seq_lens.to(torch.int64)

    def _extend_kernel(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """forward_extend by the C kernel: q [T, H, D] -> [T, H, D] in q's dtype."""
        k_buf, v_buf = self._layer_kv(layer_id)
        out = self.kernels.extend_attention(
            q.float(), k_buf, v_buf, self._slots, self._lens, self._ext, self.scaling
        )
        return out.to(q.dtype)

    def _layer_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V buffers, float32 or float16 [num_slots, Hkv, D]."""
        return self.kv_pool.k_buffer[layer_id], self.kv_pool.v_buffer[layer_id]

    def _padding_mask(self, valid: torch.Tensor, max_len: int) -> None:
        """The C decode kernel stops at each request's length: no mask to build."""
        return None

    def decode_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's (slots int64 [B, max_len], seq_lens int64 [B]) for decode kernels."""
        return self._slots, self._lens

    def extend_lens(self) -> torch.Tensor:
        """This step's new tokens per request, int64 [B], for extend kernels."""
        return self._ext

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kernels.store_kv(k.float(), v.float(), *self._layer_kv(layer_id), loc)

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        k_buf, v_buf = self._layer_kv(layer_id)
        out = self.kernels.decode_attention(
            q.float(), k_buf, v_buf, self._slots, self._lens, self.scaling
        )
        return out.to(q.dtype)
