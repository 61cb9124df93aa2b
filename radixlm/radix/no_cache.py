"""A `PrefixCache` that caches nothing (`--disable-radix-cache`).

It keeps the caller's code path identical to RadixCache: `match_prefix` always misses
(empty kv_indices, the sentinel root as last_node), lock/unlock on that root are no-ops,
and `insert` returns 0 and frees the slots it takes ownership of (`kv_indices[:n]`)
through free_fn at once. `cache_unfinished` keeps every slot with the request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from radixlm.radix.base import CacheUpdate, FreeFn, MatchResult, PrefixCache


class _Root:
    """The only node NoCache ever hands out."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NoCache.root"


class NoCache(PrefixCache):
    """Never matches, never holds slots.

    page_size: tokens per KV page (>= 1); `insert` frees `kv_indices[:n]` with n =
        len(key) rounded down to a page, like RadixCache takes ownership of that range.
    free_fn: receives the freed int64 slot tensors; None drops them (tests).
    """

    def __init__(self, page_size: int = 1, free_fn: FreeFn | None = None) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.free_fn = free_fn
        self.root = _Root()

    def match_prefix(self, key: Sequence[int], extra_key: Hashable | None = None) -> MatchResult:
        """Always an empty match: MatchResult(int64 [0], root)."""
        return MatchResult(torch.empty(0, dtype=torch.int64), self.root)

    def insert(
        self, key: Sequence[int], kv_indices: torch.Tensor, extra_key: Hashable | None = None
    ) -> int:
        """Return 0 (nothing was cached) and free `kv_indices[:n]` via free_fn.

        Raises ValueError if `len(kv_indices) < n`.
        """
        n = self.aligned_len(len(key))
        if len(kv_indices) < n:
            raise ValueError(f"insert: {len(kv_indices)} kv indices for {n} tokens")
        self._free(kv_indices[:n])
        return 0

    def lock(self, node: Any) -> None:
        """No-op (only the root exists). Raises RuntimeError for a foreign node."""
        self._check(node)

    def unlock(self, node: Any) -> None:
        """No-op (only the root exists). Raises RuntimeError for a foreign node."""
        self._check(node)

    def _check(self, node: Any) -> None:
        if node is not self.root:
            raise RuntimeError(f"NoCache got a node it did not create: {node!r}")

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def cache_unfinished(
        self,
        key: Sequence[int],
        kv_indices: torch.Tensor,
        prefix_len: int,
        last_node: Any,
        extra_key: Hashable | None = None,
    ) -> CacheUpdate:
        """Nothing is cached: the request keeps all its slots (prefix_len stays 0)."""
        self._check(last_node)
        return CacheUpdate(kv_indices.to(torch.int64), prefix_len, last_node)
