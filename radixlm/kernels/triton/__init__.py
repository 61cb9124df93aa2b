"""Triton kernels: paged decode (split-K, GQA; MLA over a latent pool), paged extend (causal
or tree mask), KV store, RMSNorm, fused SwiGLU and fused Mixture-of-Experts. Each launcher's
docstring gives its grid, blocks, shapes, dtypes and the reference it must match;
`tests/kernels` checks them under `TRITON_INTERPRET=1`.

Importing this package imports `triton`; `radixlm.kernels` imports it only when the triton
backend is built, so the CPU path never needs Triton.
"""

from __future__ import annotations

from radixlm.kernels.triton.decode_attention import decode_attention
from radixlm.kernels.triton.extend_attention import extend_attention
from radixlm.kernels.triton.fused_moe import fused_moe
from radixlm.kernels.triton.mla_decode import mla_decode_attention
from radixlm.kernels.triton.norm import rms_norm, silu_and_mul
from radixlm.kernels.triton.store_kv import store_kv

__all__ = [
    "decode_attention",
    "extend_attention",
    "fused_moe",
    "mla_decode_attention",
    "rms_norm",
    "silu_and_mul",
    "store_kv",
]
