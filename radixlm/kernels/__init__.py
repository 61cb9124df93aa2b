"""Attention backends behind one interface, chosen by name from a registry."""

from __future__ import annotations

from collections.abc import Callable

from radixlm.kernels.base import AttentionBackend
from radixlm.kernels.forward_batch import ForwardBatch, ForwardMode

#: name -> factory(kv_pool, scaling) -> AttentionBackend; GPU backends register lazily.
ATTENTION_BACKENDS: dict[str, Callable[..., AttentionBackend]] = {}


def _torch_native(kv_pool, scaling: float) -> AttentionBackend:
    from radixlm.kernels.torch_native import TorchNativeBackend

    return TorchNativeBackend(kv_pool, scaling)


ATTENTION_BACKENDS["torch_native"] = _torch_native


def resolve_device(name: str) -> str:
    """Map the `--device` setting to a torch device string ('auto' -> cuda if available)."""
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_attention_backend(name: str, device: str) -> str:
    """Map the `--attention-backend` setting to a registered backend name for `device`.

    'auto' is torch_native on CPU. Raises ValueError when a GPU-only backend is asked for
    on CPU.
    """
    if name == "auto":
        return "torch_native"
    if name != "torch_native" and device == "cpu":
        raise ValueError(f"attention backend {name!r} needs CUDA; use torch_native on CPU")
    return name


def create_attention_backend(name: str, kv_pool, scaling: float) -> AttentionBackend:
    """Build the backend registered as `name`. Raises ValueError for an unknown name."""
    try:
        factory = ATTENTION_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)}"
        ) from None
    return factory(kv_pool, scaling)


__all__ = [
    "AttentionBackend",
    "ForwardBatch",
    "ForwardMode",
    "create_attention_backend",
    "resolve_attention_backend",
    "resolve_device",
]
