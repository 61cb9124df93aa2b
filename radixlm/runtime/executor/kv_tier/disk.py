"""`DiskTier`: a file on local disk, mapped into memory, under a CPU (or any) KV pool.

Cheaper per token than the primary pool: its bytes live in the page cache and on disk,
and the kernel writes them out and drops them under memory pressure instead of the
process holding them. Lossless: rows are stored as their raw bytes.

Every tier page carries a CRC-32 (zlib) of its bytes, taken when it is written and
checked before it is loaded; a page that fails (the file was changed behind the mapping)
is not served: `read` returns False and the tree recomputes those tokens. A file that was
removed or replaced (another inode at the path) invalidates every page and is created
afresh at the next load.
"""

from __future__ import annotations

import logging
import os
import weakref
import zlib

import numpy as np
import torch

from radixlm.runtime.executor.kv_tier.base import KVTier

logger = logging.getLogger(__name__)

_INVALID = -1


class DiskTier(KVTier):
    """Memory-mapped file tier; see the module docstring.

    Args:
        pool, capacity, page_size: as `KVTier`.
        directory: where the file ``radixlm-hicache-<pid>-<id>.kv`` is created (removed
            when the tier is garbage collected or the process exits).
    """

    name = "disk"

    def __init__(self, pool, capacity: int, page_size: int, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"radixlm-hicache-{os.getpid()}-{id(self):x}.kv")
        self._map: np.memmap | None = None
        super().__init__(pool, capacity, page_size)
        self._crc = np.full(self.num_pages, _INVALID, dtype=np.int64)
        weakref.finalize(self, _unlink, self.path)

    def _make_storage(self, shape: tuple[int, ...]) -> torch.Tensor:
        self._shape = shape
        self._map = np.memmap(self.path, dtype=np.uint8, mode="w+", shape=shape)
        st = os.stat(self.path)
        self._identity = (st.st_dev, st.st_ino)
        return torch.from_numpy(self._map)

    def _file_intact(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _seal(self, pages: torch.Tensor) -> None:
        assert self._map is not None
        for p in pages.tolist():
            self._crc[p] = zlib.crc32(self._map[p])

    def _verify(self, pages: torch.Tensor) -> int:
        if not self._file_intact():
            logger.error(
                "KV tier file %s was removed or replaced: its pages are dropped", self.path
            )
            self._crc[:] = _INVALID
            self.data = self._make_storage(self._shape)
        assert self._map is not None
        return sum(1 for p in pages.tolist() if self._crc[p] != zlib.crc32(self._map[p]))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
