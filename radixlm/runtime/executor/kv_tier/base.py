"""The second KV tier's interface: slots below the primary KV pool that keep evicted prefixes.

A `KVTier` stores copies of primary-pool rows (every layer's K and V, or the latent rows of
a `LatentKVPool`) in its own slots, allocated in pages of the primary pool's page size, so
the radix tree (`radix/hiradix_cache.py`) can evict a prefix from the primary pool, keep
its node, and copy it back when a later request matches it (after SGLang's HiCache:
``HiRadixCache`` over a host KV pool).

Storage layout (every implementation): one uint8 tensor ``data`` [pages, buffers,
page_size, row_bytes], where ``buffers`` are the pool's distinct per-layer buffers and
``row_bytes`` one slot's row of a buffer as stored (`stored_row_bytes`: the raw bytes,
num_kv_heads * head_dim * element size, unless a tier encodes rows, `_encode` /
`_decode`). A page is one contiguous region, so an implementation can checksum it whole.

Sizes are in tokens (slots) unless named bytes; tier slot ``s`` is offset ``s % page_size``
of tier page ``s // page_size``. Counters (`stats`): tokens written and loaded, bytes
moved each way, seconds spent loading, pages found corrupted.
"""

from __future__ import annotations

import abc
import math
import time

import torch

from radixlm.config import parse_size
from radixlm.runtime.executor.memory import LatentKVPool, copy_rows


def parse_tier_size(text: str, bytes_per_token: int) -> int:
    """Tokens a ``--hicache-size`` value names (`config.parse_size`: plain integers are
    tokens, sizes with a unit are bytes, divided by `bytes_per_token`)."""
    value, is_bytes = parse_size(text)
    return value // bytes_per_token if is_bytes else value


def pool_buffers(pool) -> list[torch.Tensor]:
    """The pool's distinct per-layer buffers [num_slots, heads, dim]: a `LatentKVPool`'s
    v_buffer views alias its k_buffer, so only k_buffer is stored."""
    if isinstance(pool, LatentKVPool):
        return list(pool.k_buffer)
    return list(pool.k_buffer) + list(pool.v_buffer)


class KVTier(abc.ABC):
    """A second KV tier of `capacity` tokens (whole pages) under the primary `pool`.

    Args:
        pool: the primary `KVPool` or `LatentKVPool` (on any device).
        capacity: tier slots (tokens), rounded down to a page; >= one page.
        page_size: the primary pool's page size; tier pages hold as many tokens.

    Subclasses provide the storage (`_make_storage`), and may move rows their own way
    (`_store`, `_fetch`) and check pages (`_seal`, `_verify`).
    """

    name: str = ""
    #: Whether a load returns exactly the bytes stored (logprobs unchanged).
    lossless: bool = True

    def __init__(self, pool, capacity: int, page_size: int):
        self.page_size = page_size
        self.num_pages = capacity // page_size
        if self.num_pages < 1:
            raise ValueError(f"the KV tier must hold at least one page of {page_size} tokens")
        self.total = self.num_pages * page_size
        self.buffers = pool_buffers(pool)
        first = self.buffers[0]
        if any(b.shape[1:] != first.shape[1:] or b.dtype != first.dtype for b in self.buffers):
            raise ValueError("the pool's buffers differ in row shape or dtype")
        self.row_shape = tuple(first.shape[1:])
        self.dtype = first.dtype
        self.row_bytes = self.stored_row_bytes(self.row_shape, self.dtype)
        self.bytes_per_token = self.row_bytes * len(self.buffers)
        self.device = first.device
        self.data = self._make_storage(
            (self.num_pages, len(self.buffers), page_size, self.row_bytes)
        )
        self._free_pages = list(range(self.num_pages - 1, -1, -1))
        self.tokens_written = self.tokens_loaded = 0
        self.bytes_written = self.bytes_loaded = 0
        self.load_seconds = 0.0
        self.corrupt_pages = 0

    @classmethod
    def stored_row_bytes(cls, row_shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Bytes the tier stores for one slot's row of one buffer (row_shape, dtype: the
        pool's); lossless tiers store the raw bytes."""
        return math.prod(row_shape) * dtype.itemsize

    @abc.abstractmethod
    def _make_storage(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The uint8 CPU tensor of `shape` [pages, buffers, page_size, row_bytes]."""

    # ---- slots ---------------------------------------------------------------------

    def available(self) -> int:
        """Free tier slots (tokens)."""
        return len(self._free_pages) * self.page_size

    def used(self) -> int:
        """Tier slots given out (tokens): total == available() + used()."""
        return self.total - self.available()

    def alloc(self, n: int) -> torch.Tensor | None:
        """Slots for `n` tokens (a multiple of page_size) as int64 [n], whole pages in
        order; None when fewer are free."""
        pages = n // self.page_size
        if pages > len(self._free_pages):
            return None
        taken = self._free_pages[len(self._free_pages) - pages :]
        del self._free_pages[len(self._free_pages) - pages :]
        base = torch.tensor(taken[::-1], dtype=torch.int64)[:, None] * self.page_size
        return (base + torch.arange(self.page_size)).flatten()

    def free(self, slots: torch.Tensor) -> None:
        """Give back the pages of `slots` (int64 [n], whole pages from `alloc`)."""
        if slots.numel():
            self._free_pages.extend(reversed(torch.unique(slots // self.page_size).tolist()))

    def reset(self) -> None:
        """Free every slot (the tree dropped every node)."""
        self._free_pages = list(range(self.num_pages - 1, -1, -1))

    # ---- copies --------------------------------------------------------------------

    def write(self, pool_slots: torch.Tensor, tier_slots: torch.Tensor) -> None:
        """Copy the primary rows of `pool_slots` into `tier_slots` (both int64 [n], whole
        pages). Returns when the tier holds them."""
        n = len(tier_slots)
        self._store(pool_slots, tier_slots)
        self._seal(torch.unique(tier_slots // self.page_size))
        self.tokens_written += n
        self.bytes_written += n * self.bytes_per_token

    def read(self, tier_slots: torch.Tensor, pool_slots: torch.Tensor) -> bool:
        """Copy `tier_slots` back into the primary `pool_slots` (int64 [n], whole pages).
        Returns False, copying nothing, when a page fails its check (corrupted or lost):
        the caller must recompute those tokens."""
        start = time.perf_counter()
        bad = self._verify(torch.unique(tier_slots // self.page_size))
        if bad:
            self.corrupt_pages += bad
            return False
        self._fetch(tier_slots, pool_slots)
        n = len(tier_slots)
        self.tokens_loaded += n
        self.bytes_loaded += n * self.bytes_per_token
        self.load_seconds += time.perf_counter() - start
        return True

    def _index(self, tier_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tier_slots // self.page_size, tier_slots % self.page_size

    def _encode(self, rows: torch.Tensor) -> torch.Tensor:
        """Pool rows [n, *row_shape] (pool dtype, pool device) as stored bytes, uint8
        [n, row_bytes] on the same device (default: the raw bytes)."""
        return rows.view(torch.uint8).reshape(len(rows), -1)

    def _decode(self, raw: torch.Tensor) -> torch.Tensor:
        """Stored bytes uint8 [n, row_bytes] (contiguous) back as rows [n, *row_shape]
        of the pool dtype, on raw's device (default: a view of the raw bytes)."""
        return raw.view(self.dtype).reshape(len(raw), *self.row_shape)

    def _store(self, pool_slots: torch.Tensor, tier_slots: torch.Tensor) -> None:
        page, off = self._index(tier_slots)
        src = pool_slots.to(self.device)
        for b, buf in enumerate(self.buffers):
            self.data[page, b, off] = self._encode(buf.index_select(0, src)).cpu()

    def _fetch(self, tier_slots: torch.Tensor, pool_slots: torch.Tensor) -> None:
        page, off = self._index(tier_slots)
        dst = pool_slots.to(self.device)
        for b, buf in enumerate(self.buffers):
            copy_rows(buf, dst, self._decode(self.data[page, b, off].to(self.device)))

    def _seal(self, pages: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """Record what `pages` (int64) now hold, for `_verify` (default: nothing)."""

    def _verify(self, pages: torch.Tensor) -> int:
        """How many of `pages` fail their check (default: none)."""
        return 0

    # ---- introspection -------------------------------------------------------------

    def stats(self) -> dict[str, int | float | str]:
        """Capacity, usage and traffic counters (tokens, bytes, seconds)."""
        return {
            "tier": self.name,
            "tier_total": self.total,
            "tier_free": self.available(),
            "tier_used": self.used(),
            "tier_bytes_per_token": self.bytes_per_token,
            "tier_tokens_written": self.tokens_written,
            "tier_tokens_loaded": self.tokens_loaded,
            "tier_bytes_written": self.bytes_written,
            "tier_bytes_loaded": self.bytes_loaded,
            "tier_load_seconds": self.load_seconds,
            "tier_corrupt_pages": self.corrupt_pages,
        }
