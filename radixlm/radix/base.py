"""The prefix-cache interface shared by RadixCache and NoCache.

A prefix cache maps token-id sequences (keys) to KV-pool slot indices (values) so a
request whose prompt starts with an already computed prefix reuses that prefix's KV.
Sizes are counted in tokens (KV slots). `radix/` knows nothing about models: values are
1-D int64 CPU tensors of slot indices into the KV pool.

Slot ownership (identical for every implementation, so the scheduler has one code path):

* A request calls ``r = match_prefix(key)``, then ``lock(r.last_node)``. Its first
  ``p = len(r.kv_indices)`` slots belong to the cache (shared, read-only); every slot it
  allocates afterwards is *held* by the request.
* ``m = insert(key, kv)`` with ``n = len(key)`` rounded down to a page: the cache takes
  ownership of ``kv[m:n]`` (RadixCache stores them; NoCache frees them at once through
  free_fn, since m == 0). The caller still owns ``kv[p:m]`` -- duplicates of slots the
  cache already had, which it must free -- and ``kv[n:]``.
* The helpers below implement the three caller flows on top of that contract:
  `cache_finished` (request done), `cache_unfinished` (after a prefill chunk: the next
  chunk then hits) and `release` (abort without caching). Prefer them over raw `insert`.
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


class CacheUpdate(NamedTuple):
    """Result of `PrefixCache.cache_unfinished`: the request's new view of its slots.

    kv_indices: int64 tensor [len(kv_indices passed in)]; the caller writes it into its
        req-to-token row (slots [:prefix_len] may have changed to the cache's own).
    prefix_len: tokens now owned by the cache (slots the request no longer holds).
    last_node: the node now locked on the request's behalf (the old one is unlocked).
    """

    kv_indices: torch.Tensor
    prefix_len: int
    last_node: Any


class PrefixCache(abc.ABC):
    """Interface of a token-keyed KV prefix cache (after SGLang's BasePrefixCache).

    Accounting (tokens): every slot the cache owns is either *protected* (on a path
    locked by at least one running request) or *evictable* (unlocked). The allocator's
    invariant is free + evictable + protected + held_by_requests == total.
    """

    page_size: int
    free_fn: FreeFn | None

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

        Returns m, the length of the prefix of `key` that was already cached before the
        call. The cache takes ownership of `kv_indices[m:n]`; the caller keeps
        `kv_indices[:m]` (and must free those it allocated itself: the cache keeps its own
        slots for that range) and `kv_indices[n:]`. Raises ValueError if
        `len(kv_indices) < n`.
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
        """Drop every node without calling free_fn (the pool is reset alongside).

        Only valid when no request holds a lock; nodes returned earlier become invalid.
        """

    def load_back(
        self, key: Sequence[int], extra_key: Hashable | None = None, room: int = 0
    ) -> tuple[MatchResult, int]:
        """`match_prefix`, extended by a second KV tier where the cache has one: the part
        of the match held only there is copied back into fresh primary slots (at most
        `room` tokens; evicting unlocked cache for them) and joins the match. Returns
        (match, tokens loaded). Without a tier: (match_prefix(key, extra_key), 0)."""
        return self.match_prefix(key, extra_key), 0

    def tier_accounting(self) -> dict[str, int]:
        """The second tier's slot counts tier_total == tier_free + tier_used (tokens);
        empty without a tier."""
        return {}

    def tier_stats(self) -> dict[str, int | float | str]:
        """The second tier's traffic counters (`HiRadixCache.tier_stats`); empty without."""
        return {}

    def total_size(self) -> int:
        """All tokens the cache holds."""
        return self.evictable_size() + self.protected_size()

    # ---- caller flows (same code path for every implementation) -------------------

    def aligned_len(self, n: int) -> int:
        """`n` rounded down to a multiple of page_size."""
        return n - n % self.page_size

    def _free(self, slots: torch.Tensor) -> None:
        if self.free_fn is not None and slots.numel() > 0:
            self.free_fn(slots)

    def _insert_and_free_duplicates(
        self, key: Sequence[int], kv_indices: torch.Tensor, prefix_len: int, extra_key
    ) -> int:
        """Insert, free the duplicates `kv_indices[prefix_len:m]`; return n (aligned key len)."""
        n = self.aligned_len(len(key))
        if n < prefix_len:
            raise ValueError(f"key covers {n} aligned tokens < prefix_len {prefix_len}")
        m = self.insert(key, kv_indices, extra_key)
        if m < prefix_len:
            raise RuntimeError(f"cached prefix shrank from {prefix_len} to {m}: was it locked?")
        self._free(kv_indices[prefix_len:m])
        return n

    def cache_finished(
        self,
        key: Sequence[int],
        kv_indices: torch.Tensor,
        prefix_len: int,
        last_node: Any,
        extra_key: Hashable | None = None,
    ) -> None:
        """Hand a finished request's slots over: insert, free the rest, unlock.

        key: the request's token ids whose KV is in `kv_indices` (prompt + output).
        kv_indices: int64 [>= aligned_len(len(key))], every slot the request holds or
            shares; [:prefix_len] are the cache's (from `match_prefix`/`cache_unfinished`).
        After the call the request holds no slots: duplicates `[prefix_len:m]` and the
        unaligned or key-less tail `[n:]` go to free_fn, `[m:n]` to the cache.
        Raises ValueError if `n < prefix_len` (the key must cover the matched prefix) and
        RuntimeError if the locked prefix is no longer cached (it was not locked).
        """
        n = self._insert_and_free_duplicates(key, kv_indices, prefix_len, extra_key)
        self._free(kv_indices[n:])
        self.unlock(last_node)

    def cache_unfinished(
        self,
        key: Sequence[int],
        kv_indices: torch.Tensor,
        prefix_len: int,
        last_node: Any,
        extra_key: Hashable | None = None,
    ) -> CacheUpdate:
        """Cache a running request's computed prefix (after a prefill chunk) and keep it.

        Arguments as in `cache_finished`. Inserts `key[:n]`, frees the duplicates
        `[prefix_len:m]`, locks the new path and unlocks `last_node`. The returned
        kv_indices (same length as the input) replace the request's slot row; the request
        still holds `[result.prefix_len:]`. Raises as `cache_finished`.
        """
        n = self._insert_and_free_duplicates(key, kv_indices, prefix_len, extra_key)
        res = self.match_prefix(key[:n], extra_key)
        if len(res.kv_indices) != n:
            raise RuntimeError(f"inserted {n} tokens but matched {len(res.kv_indices)}")
        self.lock(res.last_node)
        self.unlock(last_node)
        new_kv = torch.cat([res.kv_indices, kv_indices[n:].to(torch.int64)])
        return CacheUpdate(new_kv, n, res.last_node)

    def release(self, kv_indices: torch.Tensor, prefix_len: int, last_node: Any) -> None:
        """Abort without caching: free the request's own slots `[prefix_len:]`, unlock."""
        self._free(kv_indices[prefix_len:])
        self.unlock(last_node)
