"""Quantized linear layers of the CUDA path: a quantized checkpoint's canonical weights
(`executor.quant`) kept on the device and multiplied by the Triton kernels of
`radixlm.kernels.triton.quant_gemm` (imported on first use): `w4a16_gemm`,
`w8a8_int8_gemm`, `w8a8_fp8_gemm`, each returning [M, N] in x's dtype and matching
`kernels.quant_ref`."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.executor.quant import W4A16, W8A8_INT8, QuantizedWeight


class QuantizedLinear(nn.Module):
    """y = x W^T (+ bias) for W held as `weight` (a `QuantizedWeight` on the device).

    forward(x [..., in] float) -> [..., out] in x's dtype.
    """

    def __init__(
        self, weight: QuantizedWeight, bias: torch.Tensor | None, device, dense_bytes: int = 0
    ):
        super().__init__()
        self._dense_bytes = dense_bytes
        self.out_features, self.in_features = weight.shape
        to = {"device": device}
        self.scheme, self.group_size = weight.scheme, weight.group_size
        self.register_buffer("q", weight.q.to(**to))
        self.register_buffer("scales", weight.scales.to(**to))
        self.register_buffer("zeros", None if weight.zeros is None else weight.zeros.to(**to))
        act = weight.act_scale
        self.register_buffer("act_scale", None if act is None else act.to(**to))
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def saved_bytes(self) -> int:
        """Bytes fewer than the dense weight it replaced (`dense_bytes`)."""
        parts = [t for t in (self.q, self.scales, self.zeros) if t is not None]
        return self._dense_bytes - sum(t.numel() * t.element_size() for t in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from radixlm.kernels.triton import quant_gemm

        flat = x.reshape(-1, self.in_features)
        if self.scheme == W4A16:
            y = quant_gemm.w4a16_gemm(flat, self.q, self.scales, self.zeros, self.group_size)
        elif self.scheme == W8A8_INT8:
            y = quant_gemm.w8a8_int8_gemm(flat, self.q, self.scales, self.act_scale)
        else:
            y = quant_gemm.w8a8_fp8_gemm(flat, self.q, self.scales, self.act_scale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def swap_quantized(model: nn.Module, weights: dict[str, QuantizedWeight]) -> int:
    """Replace each loaded nn.Linear of `model` named in `weights` by a `QuantizedLinear`
    on the same device (its dense dequantized weight is dropped); returns how many."""
    swapped = 0
    for name, qw in weights.items():
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, attr, None)
        if not isinstance(linear, nn.Linear):
            continue
        dense = linear.weight.numel() * linear.weight.element_size()
        setattr(parent, attr, QuantizedLinear(qw, linear.bias, linear.weight.device, dense))
        swapped += 1
    return swapped
