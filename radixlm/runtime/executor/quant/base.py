"""The canonical quantized weight every checkpoint format converts to, the interface of the
format readers, and the load-time error.

A reader turns a checkpoint's state dict (tensor name -> tensor, as read from its
safetensors files) into the same state with each quantized module's tensors replaced by
its dequantized float32 `weight` (what the float layouts load), plus the module's
`QuantizedWeight` in the canonical layouts of `radixlm.kernels.quant_ref`, which the
packed CPU layout keeps as quantized panels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.errors import UnsupportedModelError
from radixlm.kernels import quant_ref

#: Canonical schemes (kernels/quant_ref.py).
W4A16, W8A8_INT8, W8A8_FP8 = "w4a16", "w8a8_int8", "w8a8_fp8"


class UnsupportedQuantizationError(UnsupportedModelError):
    """A checkpoint's quantization (method, scheme, bits, group size, activation order) is
    one radixlm cannot load; raised at load, naming it."""


@dataclass
class QuantizedWeight:
    """One linear layer's weight W [N, K] in a canonical layout (`kernels.quant_ref`).

    scheme W4A16: `q` uint8 [N, K / 2] (two int4 per byte, low nibble first), `scales`
    float32 [N, K / G], `zeros` uint8 [N, K / G], `group_size` G (K for per-channel).
    scheme W8A8_INT8: `q` int8 [N, K], `scales` float32 [N] per channel. scheme W8A8_FP8:
    `q` float8_e4m3fn [N, K], `scales` float32 [N]. `act_scale` is the static activation
    scale (float32 scalar) or None for dynamic per-token scales (W8A8 only).
    """

    scheme: str
    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    group_size: int | None = None
    act_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        n = self.q.shape[0]
        return (n, self.q.shape[1] * 2) if self.scheme == W4A16 else (n, self.q.shape[1])

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, K] these values encode (quant_ref's dequantization)."""
        if self.scheme == W4A16:
            return quant_ref.dequant_w4(self.q, self.scales, self.zeros, self.group_size)
        return self.q.float() * self.scales.float().reshape(-1, 1)

    @property
    def nbytes(self) -> int:
        """Bytes of the canonical tensors."""
        parts = [self.q, self.scales] + ([self.zeros] if self.zeros is not None else [])
        return sum(t.numel() * t.element_size() for t in parts)


def check_w4(name: str, n: int, k: int, group_size: int, method: str) -> None:
    """Raise UnsupportedQuantizationError unless int4 groups of `group_size` fit the CPU
    and GPU kernels for a [n, k] weight: G a multiple of 32 dividing K (K itself for
    per-channel)."""
    if group_size <= 0 or group_size % 32 or k % group_size:
        raise UnsupportedQuantizationError(
            f"{method}: {name} has int4 group size {group_size} for K={k}; radixlm takes "
            "group sizes that are multiples of 32 dividing K (32, 64, 128, per-channel)"
        )


def per_channel(scale: torch.Tensor, n: int, name: str, method: str) -> torch.Tensor:
    """A weight scale of one value per tensor or per output channel -> float32 [n];
    raises UnsupportedQuantizationError for any other shape (block or group scales)."""
    if scale.numel() == 1:
        return scale.float().reshape(1).expand(n).contiguous()
    if scale.numel() == n:
        return scale.float().reshape(n).contiguous()
    raise UnsupportedQuantizationError(
        f"{method}: {name} has a weight scale of shape {tuple(scale.shape)}; 8-bit weights "
        "need one scale per tensor or per output channel"
    )


class CheckpointQuant:
    """A checkpoint format's reader, built from config.json's `quantization_config` (a
    dict). Subclasses set `method` and implement `convert`."""

    method = ""

    def __init__(self, qcfg: dict):
        self.qcfg = qcfg

    def convert(
        self, state: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
        """(state with each quantized module's tensors replaced by `<module>.weight`
        float32 [N, K] dequantized, {module name: QuantizedWeight}). Modules left
        unquantized (the config's ignore list: lm_head, ...) pass through unchanged.
        Raises UnsupportedQuantizationError naming an unsupported scheme."""
        raise NotImplementedError
