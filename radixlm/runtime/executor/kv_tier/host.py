"""`HostTier`: host memory under a CUDA KV pool (SGLang's host KV pool of HiCache).

Storage is page-locked host memory on CUDA, so copies run as DMA on a side stream: a
write gathers the evicted rows on the device and copies them out before returning (the
slots are reused right after); a load copies the rows in on the side stream and makes
the compute stream wait for it, so the host goes on scheduling while the copy runs and
the next forward still reads the loaded rows. With a CPU pool the same class keeps a
plain RAM copy (lossless; tests run its bookkeeping without CUDA).
"""

from __future__ import annotations

import torch

from radixlm.runtime.executor.kv_tier.base import KVTier
from radixlm.runtime.executor.memory import copy_rows


class HostTier(KVTier):
    """Host-memory tier; see the module docstring. Arguments as `KVTier`."""

    name = "host"

    def __init__(self, pool, capacity: int, page_size: int):
        self._cuda = pool_device(pool).type == "cuda"
        self._stream = torch.cuda.Stream(device=pool_device(pool)) if self._cuda else None
        self._staged: list[torch.Tensor] = []  # host rows in flight to the device
        self._done: torch.cuda.Event | None = None
        super().__init__(pool, capacity, page_size)

    def _make_storage(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.uint8, pin_memory=self._cuda)

    def _store(self, pool_slots: torch.Tensor, tier_slots: torch.Tensor) -> None:
        if not self._cuda:
            super()._store(pool_slots, tier_slots)
            return
        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            super()._store(pool_slots, tier_slots)  # .cpu() waits for the side stream

    def _fetch(self, tier_slots: torch.Tensor, pool_slots: torch.Tensor) -> None:
        if not self._cuda:
            super()._fetch(tier_slots, pool_slots)
            return
        assert self._stream is not None
        if self._done is not None:  # the previous load's host rows may be freed now
            self._done.synchronize()
        page, off = self._index(tier_slots)
        compute = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(compute)  # the slots' previous reads are done
        self._staged = []
        with torch.cuda.stream(self._stream):
            dst = pool_slots.to(self.device, non_blocking=True)
            for b, buf in enumerate(self.buffers):
                host = self.data[page, b, off].pin_memory()
                self._staged.append(host)
                rows = host.to(self.device, non_blocking=True)
                copy_rows(buf, dst, self._decode(rows))
            self._done = torch.cuda.Event()
            self._done.record(self._stream)
        compute.wait_stream(self._stream)


def pool_device(pool) -> torch.device:
    """The device of the pool's buffers."""
    return pool.k_buffer[0].device
