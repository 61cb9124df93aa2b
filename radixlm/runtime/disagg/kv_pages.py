"""Reading a request's KV out of the pool and writing received KV into it.

The pool (`runtime/executor/memory.py::KVPool`) keeps one K and one V buffer per layer,
each [num_slots, num_kv_heads, head_dim]. A transfer carries the prompt's KV as one
tensor [2 * num_layers, num_tokens, num_kv_heads, head_dim]: the K layers, then the V
layers, in token order (whole pages are not needed on the wire: each side keeps its own
slot numbering).
"""

from __future__ import annotations

import torch

from radixlm.config import ServerArgs
from radixlm.runtime.disagg.transport import KVLayout
from radixlm.runtime.executor.memory import copy_rows


def _buffers(pool) -> list[torch.Tensor]:
    """The pool's K then V buffers. Raises ValueError for a pool of another kind (the
    latent MLA pool, whose V aliases K, is not transferred)."""
    if type(pool).__name__ != "KVPool":
        raise ValueError(
            f"prefill/decode disaggregation needs a K/V pool, not {type(pool).__name__}"
        )
    return list(pool.k_buffer) + list(pool.v_buffer)


def kv_layout(args: ServerArgs, pool) -> KVLayout:
    """This worker's `KVLayout` (raises ValueError as `_buffers`)."""
    k0 = _buffers(pool)[0]
    return KVLayout(
        model_path=args.model,
        num_layers=len(pool.k_buffer),
        num_kv_heads=int(k0.shape[1]),
        head_dim=int(k0.shape[2]),
        dtype=str(k0.dtype),
        page_size=args.page_size,
    )


def gather(pool, slots: torch.Tensor) -> torch.Tensor:
    """A copy of the KV at `slots` (int64 [n]): [2 * num_layers, n, heads, head_dim] on
    the CPU, in the pool's dtype."""
    return torch.stack([buf[slots] for buf in _buffers(pool)]).cpu()


def scatter(pool, slots: torch.Tensor, kv: torch.Tensor) -> None:
    """Write `kv` ([2 * num_layers, n, heads, head_dim]) to `slots` (int64 [n])."""
    for buf, part in zip(_buffers(pool), kv, strict=True):
        copy_rows(buf, slots.to(buf.device), part.to(device=buf.device, dtype=buf.dtype))
