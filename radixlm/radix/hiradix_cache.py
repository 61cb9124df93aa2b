"""Radix cache over two KV tiers: the primary pool and a second tier that keeps evicted prefixes.

After SGLang's HiCache (``HiRadixCache``): every node records where its KV lives --
``value`` (primary slots; empty when not there) and ``host_value`` (second-tier slots;
None when not there). Eviction from the primary pool keeps a node whose KV the tier holds
(written when it was cached under ``write_through``, or now under ``write_back``) and
only frees its primary slots; the tier evicts least recently used nodes in turn, which
deletes tier-only nodes. `load_back` extends a match through tier-only nodes by copying
them into fresh primary slots, so a request computes only what neither tier holds.

Invariants (on top of `RadixCache`'s, checked by tests/radix/test_hiradix_cache.py):
* a node is primary (non-empty value), tier-only (empty value, host_value set) or both;
  every node holds its KV in at least one tier;
* the descendants of a tier-only node are tier-only: the primary evicts only nodes with
  no primary child, and loads and inserts fill a path top-down;
* `_leaves` holds the primary nodes with lock_ref == 0 and no primary child (the
  primary's eviction candidates); evictable_size() / protected_size() count primary
  slots only;
* `_host_nodes` is exactly the set of nodes with a host_value, and the tier's used slots
  equal the sum of their lengths (tier_total == tier_free + tier_used);
* `_host_heap` holds, for every node in `_host_nodes`, an entry
  (last_access_time, id, node) with its current time: an entry is pushed whenever a
  node enters the tier or a walk touches it, and entries whose node left the tier or
  was touched since are stale and skipped (the heap is rebuilt when they outnumber the
  live ones), so the tier's LRU eviction pops the oldest nodes without scanning them all.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

import torch

from radixlm.radix.base import FreeFn, MatchResult
from radixlm.radix.radix_cache import RadixCache, TreeNode, _empty_indices

logger = logging.getLogger(__name__)

WRITE_POLICIES = ("write_through", "write_back")


class TierStore(Protocol):
    """What the tree needs of a second KV tier (`runtime/executor/kv_tier` implements it).

    Slots are int64 tensors of whole pages; `read` returns False when the stored pages
    fail their check (nothing is copied then)."""

    page_size: int
    total: int

    def available(self) -> int: ...
    def alloc(self, n: int) -> torch.Tensor | None: ...
    def free(self, slots: torch.Tensor) -> None: ...
    def reset(self) -> None: ...
    def write(self, pool_slots: torch.Tensor, tier_slots: torch.Tensor) -> None: ...
    def read(self, tier_slots: torch.Tensor, pool_slots: torch.Tensor) -> bool: ...
    def stats(self) -> dict: ...


class PageSource(Protocol):
    """The primary pool's allocator (`PagedAllocator`): free slots and whole pages."""

    def available(self) -> int: ...
    def alloc_pages(self, n: int) -> torch.Tensor: ...


def _primary(node: TreeNode) -> bool:
    return node.value.numel() > 0


class HiRadixCache(RadixCache):
    """`RadixCache` with a second KV tier; see the module docstring.

    Args:
        page_size, free_fn, clock: as `RadixCache` (free_fn returns primary slots).
        tier: the second tier (same page size).
        allocator: the primary pool's allocator, for the slots `load_back` fills.
        write_policy: ``write_through`` (copy each node to the tier when it is inserted)
            or ``write_back`` (copy it when the primary evicts it).

    Raises ValueError for an unknown write policy or a tier of another page size.
    """

    def __init__(
        self,
        page_size: int,
        free_fn: FreeFn | None,
        *,
        tier: TierStore,
        allocator: PageSource,
        write_policy: str = "write_through",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        if tier.page_size != page_size:
            raise ValueError(f"tier page size {tier.page_size} != cache page size {page_size}")
        self.tier = tier
        self.allocator = allocator
        self.write_through = write_policy == "write_through"
        self.loaded_tokens = 0  # tokens copied back by load_back
        self.dropped_tokens = 0  # tier tokens whose pages failed their check
        super().__init__(page_size, free_fn, clock=clock)

    def reset(self) -> None:
        super().reset()
        self._host_nodes: set[TreeNode] = set()
        self._host_heap: list[tuple[float, int, TreeNode]] = []
        self._host_tokens = 0
        self.tier.reset()

    # ---- bookkeeping ---------------------------------------------------------------

    def _refresh(self, node: TreeNode) -> None:
        """Put `node` in `_leaves` exactly when it is a primary eviction candidate."""
        if node.is_root:
            return
        if (
            _primary(node)
            and node.lock_ref == 0
            and not any(_primary(c) for c in node.children.values())
        ):
            self._leaves.add(node)
        else:
            self._leaves.discard(node)

    def _set_host(self, node: TreeNode, slots: torch.Tensor | None) -> None:
        if node.host_value is not None:
            self.tier.free(node.host_value)
            self._host_tokens -= len(node.host_value)
            self._host_nodes.discard(node)
        node.host_value = slots
        if slots is not None:
            self._host_tokens += len(slots)
            self._host_nodes.add(node)
            self._push_host(node)

    def _push_host(self, node: TreeNode) -> None:
        """Record `node`'s current access time in the tier's LRU heap."""
        if len(self._host_heap) > 2 * len(self._host_nodes) + 64:
            self._host_heap = [(x.last_access_time, x.id, x) for x in self._host_nodes]
            heapq.heapify(self._host_heap)
        heapq.heappush(self._host_heap, (node.last_access_time, node.id, node))

    def _walk(self, root: TreeNode, key, now: float):
        node, pos, values = super()._walk(root, key, now)
        x = node
        while not x.is_root:  # the walk touched the whole path
            if x.host_value is not None:
                self._push_host(x)
            x = x.parent
        return node, pos, values

    def _set_value(self, node: TreeNode, slots: torch.Tensor) -> None:
        """Give a tier-only node primary slots (a load or an insert adopting them)."""
        n = len(slots)
        node.value = slots
        if node.lock_ref == 0:
            self._evictable += n
        else:
            self._protected += n
        self._refresh(node)
        self._refresh(node.parent)

    def _path(self, node: TreeNode) -> list[TreeNode]:
        """Nodes root..node, root excluded, top-down."""
        path = []
        while not node.is_root:
            path.append(node)
            node = node.parent
        return path[::-1]

    def _delete(self, node: TreeNode) -> None:
        """Remove `node` and its (tier-only) subtree; frees their tier slots."""
        parent = node.parent
        assert parent is not None and node.lock_ref == 0
        del parent.children[self._child_key(node.key, 0)]
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            assert not _primary(n) and n.lock_ref == 0, n
            self._set_host(n, None)
            self._leaves.discard(n)
            n.evicted = True
        if parent.is_root:
            if not parent.children and parent.extra_key is not None:
                del self._roots[parent.extra_key]
        else:
            self._refresh(parent)

    # ---- the second tier ----------------------------------------------------------

    def _tier_alloc(self, n: int) -> torch.Tensor | None:
        """Tier slots for n tokens, evicting the tier's LRU entries when short: host copies
        of nodes also in the primary pool, or whole tier-only leaves. None if impossible."""
        heap, skipped = self._host_heap, []
        while self.tier.available() < n and heap:
            entry = heapq.heappop(heap)
            t, _, x = entry
            if x not in self._host_nodes or t != x.last_access_time:
                continue  # stale: left the tier, or touched since (a newer entry exists)
            if x.lock_ref > 0 or not (_primary(x) or not x.children):
                skipped.append(entry)  # not evictable now; stays in the tier
                continue
            if _primary(x):
                self._set_host(x, None)
                continue
            parent = x.parent
            self._delete(x)
            if not parent.is_root and not _primary(parent) and not parent.children:
                if parent.lock_ref == 0 and parent.host_value is not None:
                    heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        for entry in skipped:
            heapq.heappush(heap, entry)
        return self.tier.alloc(n)

    def _write(self, node: TreeNode) -> bool:
        """Copy a primary node to the tier unless it is there; False when it cannot fit."""
        if node.host_value is not None:
            return True
        slots = self._tier_alloc(len(node.value))
        if slots is None:
            return False
        self.tier.write(node.value, slots)
        self._set_host(node, slots)
        return True

    # ---- PrefixCache ---------------------------------------------------------------

    def _split(self, node: TreeNode, k: int) -> TreeNode:
        top = super()._split(node, k)
        if node.host_value is not None:
            host = node.host_value
            top.host_value, node.host_value = host[:k].clone(), host[k:].clone()
            self._host_nodes.add(top)
            self._push_host(top)
        return top

    def _match(self, key: Sequence[int], extra_key: Hashable | None):
        """(root, primary nodes, tier-only nodes) along the longest match of `key`."""
        tkey = self._normalize(key)
        root = self._roots.get(extra_key)
        if root is None or not tkey:
            return (root if root is not None else self._default_root), [], []
        node, _, _ = self._walk(root, tkey, self.clock())
        path = self._path(node)
        for n in path:
            n.hit_count += 1
        k = 0
        while k < len(path) and _primary(path[k]):
            k += 1
        return root, path[:k], path[k:]

    @staticmethod
    def _result(root: TreeNode, nodes: list[TreeNode]) -> MatchResult:
        kv = torch.cat([n.value for n in nodes]) if nodes else _empty_indices()
        return MatchResult(kv, nodes[-1] if nodes else root)

    def match_prefix(self, key: Sequence[int], extra_key: Hashable | None = None) -> MatchResult:
        """The longest prefix of `key` in the primary pool (see `PrefixCache`); tier-only
        nodes past it are not part of the result (`load_back` brings them in)."""
        root, primary, _ = self._match(key, extra_key)
        return self._result(root, primary)

    def load_back(
        self, key: Sequence[int], extra_key: Hashable | None = None, room: int = 0
    ) -> tuple[MatchResult, int]:
        """See `PrefixCache.load_back`. Loads the tier-only part of the match when it is
        at most `room` tokens and the primary pool can supply it (evicting unlocked
        cache); a node whose tier pages fail their check is deleted with its subtree,
        and the match ends before it (those tokens are recomputed)."""
        root, primary, tier_nodes = self._match(key, extra_key)
        need = sum(len(n.key) for n in tier_nodes)
        if not tier_nodes or need > room:
            return self._result(root, primary), 0
        self.lock(tier_nodes[-1])  # keeps the path out of both tiers' eviction
        short = need - self.allocator.available()
        if short > 0:
            self.evict(short)
        pages = None
        if self.allocator.available() >= need:
            pages = self.allocator.alloc_pages(need // self.page_size)
        self.unlock(tier_nodes[-1])
        if pages is None:
            return self._result(root, primary), 0
        slots = (pages[:, None] * self.page_size + torch.arange(self.page_size)).flatten()
        pos = 0
        for node in tier_nodes:
            chunk = slots[pos : pos + len(node.key)]
            assert node.host_value is not None
            if not self.tier.read(node.host_value, chunk):
                logger.warning("KV tier pages of %d tokens failed their check", len(node.key))
                self.dropped_tokens += sum(len(n.key) for n in tier_nodes[tier_nodes.index(node) :])
                self._free(slots[pos:])
                self._delete(node)
                break
            self._set_value(node, chunk.clone())
            primary.append(node)
            pos += len(chunk)
        self.loaded_tokens += pos
        return self._result(root, primary), pos

    def insert(
        self, key: Sequence[int], kv_indices: torch.Tensor, extra_key: Hashable | None = None
    ) -> int:
        """See `PrefixCache.insert`; returns the primary-cached length m. Tier-only nodes
        on the path adopt their slice of `kv_indices` (so the cache owns `[m:n]`);
        under write_through the new leaf is copied to the tier at once."""
        tkey = self._normalize(key)
        n = len(tkey)
        if n == 0:
            return 0
        if len(kv_indices) < n:
            raise ValueError(f"insert: {len(kv_indices)} kv indices for {n} tokens")
        now = self.clock()
        node, matched, _ = self._walk(self._root(extra_key), tkey, now)
        path = self._path(node)
        m = sum(len(x.key) for x in path if _primary(x))
        pos = m
        for x in path:
            if not _primary(x):
                self._set_value(x, kv_indices[pos : pos + len(x.key)].to(torch.int64, copy=True))
                pos += len(x.key)
        if matched < n:
            leaf = TreeNode(
                tkey[matched:], kv_indices[matched:n].to(torch.int64, copy=True), node, now
            )
            node.children[self._child_key(tkey, matched)] = leaf
            self._evictable += n - matched
            self._refresh(leaf)
            self._refresh(node)
            if self.write_through:
                self._write(leaf)
        return m

    def lock(self, node: TreeNode) -> None:
        """As `RadixCache.lock`; primary slots move from evictable to protected, and a
        locked tier-only node is kept out of the tier's eviction."""
        if node.evicted:
            raise RuntimeError(f"lock on evicted node {node!r}")
        while not node.is_root:
            if node.lock_ref == 0:
                self._evictable -= len(node.value)
                self._protected += len(node.value)
            node.lock_ref += 1
            self._leaves.discard(node)
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """As `RadixCache.unlock`. Raises RuntimeError if the node is not locked."""
        if not node.is_root and (node.lock_ref <= 0 or node.evicted):
            raise RuntimeError(f"unlock on unlocked node {node!r}")
        while not node.is_root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.value)
                self._protected -= len(node.value)
                self._refresh(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free primary slots of unlocked nodes without a primary child, LRU first, until
        `num_tokens` are freed. A node the tier holds (or now takes, write_back) stays as a
        tier-only node; one the tier cannot take is deleted. Returns primary slots freed."""
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access_time, n.id, n) for n in self._leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if node not in self._leaves:
                continue  # its state changed since it was pushed
            self._leaves.discard(node)
            kept = self._write(node)
            value, node.value = node.value, _empty_indices()
            self._evictable -= len(value)
            freed += len(value)
            self._free(value)
            parent = node.parent
            if kept:
                self._refresh(parent)
            else:
                self._delete(node)
            if parent in self._leaves:
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        logger.debug("evicted %d primary tokens (asked %d)", freed, num_tokens)
        return freed

    # ---- introspection -------------------------------------------------------------

    def host_size(self) -> int:
        """Tokens the tier holds for nodes of this tree."""
        return self._host_tokens

    def tier_accounting(self) -> dict[str, int]:
        return {
            "tier_total": self.tier.total,
            "tier_free": self.tier.available(),
            "tier_used": self._host_tokens,
        }

    def tier_stats(self) -> dict[str, int | float | str]:
        """The tier's counters (`KVTier.stats`) plus tier_hit_tokens (tokens `load_back`
        copied back) and tier_dropped_tokens (tokens lost to failed page checks)."""
        return {
            **self.tier.stats(),
            "tier_hit_tokens": self.loaded_tokens,
            "tier_dropped_tokens": self.dropped_tokens,
        }

    def __repr__(self) -> str:
        return (
            f"HiRadixCache(page_size={self.page_size}, evictable={self._evictable}, "
            f"protected={self._protected}, tier={self._host_tokens}/{self.tier.total})"
        )
