"""Attention backends behind one interface, chosen by name from a registry."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

from radixlm.kernels.base import AttentionBackend
from radixlm.kernels.forward_batch import ForwardBatch, ForwardMode

#: name -> factory(kv_pool, scaling, **model_info) -> AttentionBackend. Each factory imports
#: its module on call, so GPU-only dependencies (triton, flashinfer) load only when chosen.
ATTENTION_BACKENDS: dict[str, Callable[..., AttentionBackend]] = {}


def _torch_native(kv_pool, scaling: float, sliding_windows=None, **_) -> AttentionBackend:
    from radixlm.kernels.torch_native import TorchNativeBackend

    return TorchNativeBackend(kv_pool, scaling, sliding_windows)


def _cpu(
    kv_pool, scaling: float, num_heads: int | None = None, sliding_windows=None, **_
) -> AttentionBackend:
    from radixlm.kernels.cpu import CpuKernels
    from radixlm.kernels.cpu_native import CpuNativeBackend, supports_pool
    from radixlm.kernels.torch_native import TorchNativeBackend

    kernels = CpuKernels.load()
    if kernels is None or not supports_pool(kv_pool, num_heads):
        return TorchNativeBackend(kv_pool, scaling, sliding_windows)
    return CpuNativeBackend(kv_pool, scaling, kernels, sliding_windows)


def _triton(kv_pool, scaling: float, sliding_windows=None, **_) -> AttentionBackend:
    from radixlm.kernels.triton.backend import TritonBackend

    return TritonBackend(kv_pool, scaling, sliding_windows)


def _flashinfer(kv_pool, scaling: float, **model_info) -> AttentionBackend:
    from radixlm.kernels.flashinfer import FlashInferBackend

    return FlashInferBackend(kv_pool, scaling, **model_info)


ATTENTION_BACKENDS["torch_native"] = _torch_native
ATTENTION_BACKENDS["cpu"] = _cpu
ATTENTION_BACKENDS["triton"] = _triton
ATTENTION_BACKENDS["flashinfer"] = _flashinfer


def flashinfer_available() -> bool:
    """Whether the optional `flashinfer` package (extra `radixlm[gpu]`) is installed."""
    return importlib.util.find_spec("flashinfer") is not None


def triton_interpreting() -> bool:
    """Whether Triton kernels run on CPU tensors (`TRITON_INTERPRET=1`, tests only)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_device(name: str) -> str:
    """Map the `--device` setting to a torch device string ('auto' -> cuda if available)."""
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_attention_backend(
    name: str, device: str, dtype: str | None = None, kv_dtype=None
) -> str:
    """Map the `--attention-backend` setting to a registered backend name for `device`.

    'auto' is flashinfer on CUDA when installed (and `dtype`, the model's, is not float32:
    FlashInfer's kernels are half precision; and `kv_dtype`, the KV pool's torch dtype, is
    not fp8: radixlm passes FlashInfer no fp8 scales), else triton on CUDA; on CPU it is
    cpu (torch_native with radixlm's C attention kernels, which itself falls back to
    torch_native where the kernels cannot be built or the KV pool is outside them).
    Raises ValueError when a GPU-only backend is asked for on CPU (triton is allowed on CPU
    under `TRITON_INTERPRET=1`), flashinfer is asked for but not installed, or flashinfer
    is asked for over an fp8 KV pool (naming both).
    """
    from radixlm.kernels.fp8 import is_fp8

    on_cuda = str(device).startswith("cuda")
    fp8 = kv_dtype is not None and is_fp8(kv_dtype)
    if name == "auto":
        if not on_cuda:
            return "cpu"
        half = dtype != "float32"
        return "flashinfer" if half and not fp8 and flashinfer_available() else "triton"
    if name == "cpu" and on_cuda:
        raise ValueError("attention backend 'cpu' runs on CPU; use triton or flashinfer on CUDA")
    if name == "triton" and not on_cuda and not triton_interpreting():
        raise ValueError("attention backend 'triton' needs CUDA (or TRITON_INTERPRET=1 on CPU)")
    if name == "flashinfer":
        if fp8:
            raise ValueError(
                f"attention backend 'flashinfer' does not read an fp8 KV cache ({kv_dtype}); "
                "use triton with --kv-cache-dtype fp8_e4m3 / fp8_e5m2"
            )
        if not on_cuda:
            raise ValueError("attention backend 'flashinfer' needs CUDA; use cpu on CPU")
        if not flashinfer_available():
            raise ValueError("attention backend 'flashinfer' needs `pip install radixlm[gpu]`")
    return name


def create_attention_backend(name: str, kv_pool, scaling: float, **model_info) -> AttentionBackend:
    """Build the backend registered as `name`. Raises ValueError for an unknown name.

    `model_info` (num_heads, page_size, dtype) is passed on to factories that plan ahead
    (flashinfer); the others ignore it, except `sliding_windows` (one window or None per
    layer, `AttentionBackend`), which every factory passes on to its backend.
    """
    try:
        factory = ATTENTION_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)}"
        ) from None
    return factory(kv_pool, scaling, **model_info)


__all__ = [
    "AttentionBackend",
    "ForwardBatch",
    "ForwardMode",
    "create_attention_backend",
    "flashinfer_available",
    "resolve_attention_backend",
    "resolve_device",
]
