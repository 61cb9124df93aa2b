"""Lossy host-memory tiers (``--hicache-tier fp8`` / ``int8``): each row stored as 8-bit
values with a per-row scale, cheaper per token than the primary pool.

A slot's row of one buffer [heads, dim] (a `LatentKVPool` row: [1, dim]) is stored as its
heads * dim values quantized to one byte each, then one float32 scale per head (per
token, per layer, per head: absmax scaling, as in vLLM's fp8 KV cache and the
per-token quantization of KIVI, Liu et al. 2024):

    scale = max|x| / qmax      (1 for an all-zero row)
    fp8:  q = fp8_e4m3fn(x / scale)             qmax = 448 (the format's largest normal)
    int8: q = round(x / scale) clamped to +-127  qmax = 127

so a token costs layers * 2 * heads * (dim + 4) bytes: about half of an fp16 / bf16 pool's
and a quarter of an fp32 pool's. Decoding is q * scale in float32, cast to the pool dtype.

Error bound per value (before the final cast to the pool dtype, which adds its own half
ULP): fp8 e4m3 keeps 3 mantissa bits, so a value in the normal range is off by at most
2^-4 of itself and a subnormal one (|x| < 2^-6 * scale) by at most half the subnormal
step, 2^-10 * scale; int8 is off by at most scale / 2. Loads are not exact, so logprobs
after a load move within that error and greedy tokens may flip at near ties.

Storage and copies are `HostTier`'s (pinned memory and a side stream on CUDA); rows are
encoded and decoded on the pool's device.
"""

from __future__ import annotations

import math

import torch

from radixlm.runtime.executor.kv_tier.host import HostTier

_SCALE_BYTES = 4  # one float32 per head


class _QuantTier(HostTier):
    """8-bit tier with per-row float32 scales; see the module docstring."""

    lossless = False
    qdtype: torch.dtype
    qmax: float

    @classmethod
    def stored_row_bytes(cls, row_shape: tuple[int, ...], dtype: torch.dtype) -> int:
        groups = math.prod(row_shape[:-1])
        return math.prod(row_shape) + groups * _SCALE_BYTES

    def _quantize(self, x: torch.Tensor) -> torch.Tensor:
        """x / scale (float32) as `qdtype`."""
        raise NotImplementedError

    def _encode(self, rows: torch.Tensor) -> torch.Tensor:
        n = len(rows)
        x = rows.float()
        amax = x.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(amax > 0, amax / self.qmax, torch.ones_like(amax))
        q = self._quantize(x / scale).view(torch.uint8).reshape(n, -1)
        return torch.cat([q, scale.reshape(n, -1).view(torch.uint8)], dim=1)

    def _decode(self, raw: torch.Tensor) -> torch.Tensor:
        n = len(raw)
        values = math.prod(self.row_shape)
        q = raw[:, :values].contiguous().view(self.qdtype).reshape(n, *self.row_shape)
        scale = raw[:, values:].contiguous().view(torch.float32)
        scale = scale.reshape(n, *self.row_shape[:-1], 1)
        return (q.float() * scale).to(self.dtype)


class Fp8Tier(_QuantTier):
    """fp8 e4m3 values (``torch.float8_e4m3fn``) with per-row scales."""

    name = "fp8"
    qdtype = torch.float8_e4m3fn
    qmax = 448.0

    def _quantize(self, x: torch.Tensor) -> torch.Tensor:
        # |x / scale| <= 448 up to float32 rounding; the clamp keeps it finite.
        return x.clamp(-self.qmax, self.qmax).to(self.qdtype)


class Int8Tier(_QuantTier):
    """int8 values with per-row scales (symmetric, round to nearest)."""

    name = "int8"
    qdtype = torch.int8
    qmax = 127.0

    def _quantize(self, x: torch.Tensor) -> torch.Tensor:
        return x.round().clamp(-self.qmax, self.qmax).to(self.qdtype)
