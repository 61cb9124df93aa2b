"""fp8 KV-cache formats: names, storage dtypes, and the quantize / dequantize rules every
pool and backend shares.

A pool of format e4m3 (``torch.float8_e4m3fn``: 4 exponent bits, 3 mantissa bits, largest
finite 448) or e5m2 (``torch.float8_e5m2``: 5 and 2, largest finite 57344) stores each K or
V value x of layer l as

    stored = fp8(clamp(float32(x) / scale_l, -max, max))     (round to nearest even)
    read   = float32(stored) * scale_l

with one float32 scale per layer for K and one for V (`KVScales`). The clamp saturates
out-of-range values instead of making them inf or NaN. Attention kernels fold the scales
in rather than rescaling every element: scores = (softmax_scale * k_scale) * q . k_stored,
output = v_scale * sum_t p_t v_stored_t. Formats: OCP 8-bit floating point specification
(2023); Micikevicius et al. 2022, "FP8 formats for deep learning".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: `--kv-cache-dtype` name -> storage dtype.
FP8_DTYPES: dict[str, torch.dtype] = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
#: Largest finite value of each storage dtype.
FP8_MAX: dict[torch.dtype, float] = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether `dtype` is one of the fp8 KV storage dtypes."""
    return dtype in FP8_MAX


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x (any float dtype) as fp8 `dtype`: clamp(float32(x) / scale, +-max) rounded to
    nearest even (torch's cast). Shape unchanged."""
    limit = FP8_MAX[dtype]
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fp8 x as `dtype`: float32(x) * scale, then cast. Shape unchanged."""
    out = x.float()
    if scale != 1.0:
        out = out * scale
    return out.to(dtype)


@dataclass(frozen=True)
class KVScales:
    """Per-layer dequantization scales of an fp8 pool (float32 values, one per layer).

    Attributes:
        k, v: tuple of floats, len = num_layers; read value = stored * scale.
    Raises ValueError when a scale is not finite and > 0 or the lengths differ.
    """

    k: tuple[float, ...]
    v: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.k) != len(self.v):
            raise ValueError(f"{len(self.k)} K scales but {len(self.v)} V scales")
        bad = [s for s in self.k + self.v if not (s > 0 and s < float("inf"))]
        if bad:
            raise ValueError(f"KV scales must be finite and > 0, got {bad[:4]}")

    @classmethod
    def ones(cls, num_layers: int) -> KVScales:
        """Scale 1.0 for every layer (no checkpoint scales)."""
        return cls((1.0,) * num_layers, (1.0,) * num_layers)


def pool_scales(kv_pool, layer_id: int) -> tuple[float, float]:
    """(k_scale, v_scale) of one layer of `kv_pool`: its `kv_scales` where it is an fp8
    pool, else (1.0, 1.0)."""
    scales = getattr(kv_pool, "kv_scales", None)
    if scales is None:
        return 1.0, 1.0
    return scales.k[layer_id], scales.v[layer_id]
