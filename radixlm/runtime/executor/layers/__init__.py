"""Layer factories: what a model is built of (see `base.LayerFactory`).

`TorchLayers` (plain torch: the reference), `CudaLayers` (the CUDA path: torch, Triton
fused MoE), `PackedCpuLayers` (packed panels and C kernels on CPU), `InputMajorCpuLayers`
(the CPU fallback); `cpu_layers` chooses between the CPU ones.
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu import CpuKernels
from radixlm.runtime.executor.layers.base import CudaLayers, LayerFactory, TorchLayers
from radixlm.runtime.executor.layers.cpu_linear import FloatPanels
from radixlm.runtime.executor.layers.input_major import InputMajorCpuLayers
from radixlm.runtime.executor.layers.packed import PackedCpuLayers


def cpu_layers(
    kernels: CpuKernels | None,
    dtype: torch.dtype,
    source: FloatPanels | None = None,
    lm_head_screen: bool = True,
) -> LayerFactory:
    """The CPU layout for weights of `dtype`: packed (`PackedCpuLayers` over `source`)
    with `kernels` and fp32 weights, else input-major."""
    if kernels is not None and dtype == torch.float32:
        return PackedCpuLayers(kernels, source, lm_head_screen)
    return InputMajorCpuLayers()


__all__ = [
    "CudaLayers",
    "InputMajorCpuLayers",
    "LayerFactory",
    "PackedCpuLayers",
    "TorchLayers",
    "cpu_layers",
]
