"""Weight layouts the CPU kernels read: 16-column packed fp32 panels (quantized ones are in
`quant.py`), and a transparent-huge-page mapping to hold them."""

from __future__ import annotations

import logging
import math
import mmap

import torch

logger = logging.getLogger(__name__)

#: Panel width in output columns (two AVX2 registers or one AVX-512 register of fp32).
PANEL = 16


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """Pack W [N, K] (fp32) into panels [ceil(N / 16), K, 16], zero-padding the last one.

    Panel b holds columns 16b..16b+15 of W^T, so it is one contiguous stream of K * 64
    bytes. Same bytes as W plus the padding.
    """
    n, k = weight.shape
    nb = -(-n // PANEL)
    padded = torch.zeros(nb * PANEL, k, dtype=weight.dtype)
    padded[:n] = weight.detach()
    return padded.view(nb, PANEL, k).transpose(1, 2).contiguous()


def pack_pair_panels(weight: torch.Tensor) -> torch.Tensor:
    """Pack W [N, K] (bfloat16) into pair panels [ceil(N / 16), ceil(K / 2), 16, 2]: panel
    b, row j holds (W[n, 2j], W[n, 2j + 1]) for the columns n = 16b..16b+15, the operand
    layout of AVX-512 BF16's `vdpbf16ps`. Zero-padded in N and K."""
    n, k = weight.shape
    nb, k2 = -(-n // PANEL), -(-k // 2)
    padded = torch.zeros(nb * PANEL, 2 * k2, dtype=weight.dtype)
    padded[:n, :k] = weight.detach()
    return padded.view(nb, PANEL, k2, 2).transpose(1, 2).contiguous()


#: Transparent huge page size on x86-64 (bytes).
HUGE_PAGE = 2 << 20


def empty_in_huge_pages(
    specs: list[tuple[tuple[int, ...], torch.dtype]],
) -> tuple[mmap.mmap | None, list[torch.Tensor]]:
    """Uninitialized tensors of the given (shape, dtype) specs, laid one after another in
    one anonymous mapping advised for transparent huge pages (Linux
    `madvise(MADV_HUGEPAGE)`), the first 2 MiB-aligned and each on a 64-byte boundary.

    Nothing is touched here: the pages are mapped (2 MiB at a time) on first write, like
    `torch.empty`'s. Returns (mapping, tensors): the tensors are views of the mapping,
    which the caller must keep alive as long as them. Where the platform has no
    MADV_HUGEPAGE or the kernel refuses it, returns (None, []); callers then allocate as
    usual.
    """
    if not hasattr(mmap, "MADV_HUGEPAGE") or not specs:
        return None, []
    sizes = [-(-math.prod(shape) * dt.itemsize // 64) * 64 for shape, dt in specs]
    arena = mmap.mmap(
        -1, sum(sizes) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    )  # fmt: skip
    try:
        arena.madvise(mmap.MADV_HUGEPAGE)
    except OSError as exc:  # e.g. a kernel built without transparent huge pages
        logger.info("no transparent huge pages (madvise: %s)", exc)
        arena.close()
        return None, []
    flat = torch.frombuffer(arena, dtype=torch.uint8)
    offset = -flat.data_ptr() % HUGE_PAGE
    views = []
    for (shape, dt), size in zip(specs, sizes):
        nbytes = math.prod(shape) * dt.itemsize
        views.append(flat[offset : offset + nbytes].view(dt).view(shape))
        offset += size
    return arena, views


def into_huge_pages(tensors: list[torch.Tensor]) -> tuple[mmap.mmap | None, list[torch.Tensor]]:
    """Copy `tensors` (any dtypes: fp32 or quantized uint8 panels) into one mapping of
    `empty_in_huge_pages`.

    Decode steps stream every weight once per step; with 4 KiB pages each page of that
    stream costs a TLB miss (measurements: docs/perf-notes.md, "Weights and KV in huge
    pages").

    Returns (mapping, copies): the copies are views of the mapping, which the caller must
    keep alive as long as them. Where the platform has no MADV_HUGEPAGE or the kernel
    refuses it, returns (None, tensors) unchanged.
    """
    arena, copies = empty_in_huge_pages([(tuple(t.shape), t.dtype) for t in tensors])
    if arena is None:
        return None, tensors
    for copy, t in zip(copies, tensors):
        copy.copy_(t)
    return arena, copies
