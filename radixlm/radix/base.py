"""The prefix-cache interface shared by RadixCache and NoCache.

A prefix cache maps token-id sequences (keys) to KV-pool slot indices (values) so a
request whose prompt starts with an already computed prefix reuses that prefix's KV.
Sizes are counted in tokens (KV slots). `radix/` knows nothing about models: values are
1-D int64 CPU tensors of slot indices into the KV pool.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import torch

#: Called with a 1-D int64 tensor of KV slot indices the cache gives back to the allocator.
FreeFn = Callable[[torch.Tensor], None]


class MatchResult(NamedTuple):
    """Result of `PrefixCache.match_prefix`.

    kv_indices: int64 tensor [matched_len] of KV slots holding the matched prefix
        (matched_len is a multiple of the cache's page size).
    last_node: the deepest node on the matched path; pass it to `lock`/`unlock`.
    """

    kv_indices: torch.Tensor
    last_node: Any


class PrefixCache(abc.ABC):
    """Interface of a token-keyed KV prefix cache (after SGLang's BasePrefixCache).

    Accounting (tokens): every slot the cache owns is either *protected* (on a path
    locked by at least one running request) or *evictable* (unlocked). The allocator's
    invariant is free + evictable + protected + held_by_requests == total.
    """

    page_size: int

    @abc.abstractmethod
    def match_prefix(self, key: Sequence[int], extra_key: Hashable | None = None) -> MatchResult:
        """Longest cached, page-aligned prefix of `key` in namespace `extra_key`.

        Splits a node when the match ends inside it. Updates access times.
        """

    @abc.abstractmethod
    def insert(
        self, key: Sequence[int], kv_indices: torch.Tensor, extra_key: Hashable | None = None
    ) -> int:
        """Insert `key[:n]` -> `kv_indices[:n]` with n = len(key) rounded down to a page.

        Returns the length of the prefix of `key` that was already cached before the call;
        the caller owns, and must free, the duplicate slots it passed for that range
        (the cache keeps its own). `len(kv_indices)` must be >= n.
        """

    @abc.abstractmethod
    def lock(self, node: Any) -> None:
        """Protect the path root..node from eviction (reference counted)."""

    @abc.abstractmethod
    def unlock(self, node: Any) -> None:
        """Undo one `lock(node)`. Raises RuntimeError if the path is not locked."""

    @abc.abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked leaves in LRU order if possible.

        Returns the number of slots actually freed (handed to the cache's free_fn).
        """

    @abc.abstractmethod
    def evictable_size(self) -> int:
        """Tokens held by the cache on unlocked nodes."""

    @abc.abstractmethod
    def protected_size(self) -> int:
        """Tokens held by the cache on locked nodes."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Drop every node without calling free_fn (the pool is reset alongside)."""

    def total_size(self) -> int:
        """All tokens the cache holds."""
        return self.evictable_size() + self.protected_size()
