"""Radix-tree prefix cache with LRU eviction of unlocked leaves.

Algorithm after RadixAttention (Zheng et al. 2023, "SGLang: Efficient Execution of
Structured Language Model Programs", arXiv:2312.07104): a radix tree whose edges are
token-id segments and whose nodes carry the KV-pool slots of those tokens. A match walks
down from the root and splits the node where the match ends; running requests lock the
path they use; eviction frees least-recently-used unlocked leaves, which may expose their
parent as a new evictable leaf.

Invariants (checked by tests/radix):
* every non-root node has a non-empty key whose length is a multiple of page_size, and
  `len(node.value) == len(node.key)`;
* `parent.lock_ref >= child.lock_ref`, so unlocked nodes form whole subtrees;
* `_leaves` is exactly the set of non-root nodes with no children and lock_ref == 0;
* evictable_size() / protected_size() are the token sums over nodes with lock_ref == 0 / > 0.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch

from radixlm.radix.base import FreeFn, MatchResult, PrefixCache

logger = logging.getLogger(__name__)

Key = tuple[int, ...]
_ids = itertools.count()


def _empty_indices() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


class TreeNode:
    """One radix-tree node.

    key: token ids of this edge segment (tuple of ints; empty only for a root).
    value: int64 tensor [len(key)] of KV slots for those tokens (empty for a root).
    children: child nodes keyed by their first token (page_size 1) or first page (tuple).
    lock_ref: number of locks on paths through this node (0 = evictable).
    last_access_time: `clock()` value of the last match/insert through it (seconds).
    hit_count: number of matches that used this node.
    host_value: the node's slots in a second KV tier, or None (see `HiRadixCache`).
    """

    __slots__ = (
        "key", "value", "children", "parent", "lock_ref",
        "last_access_time", "hit_count", "id", "extra_key", "evicted", "host_value",
    )  # fmt: skip

    def __init__(
        self,
        key: Key = (),
        value: torch.Tensor | None = None,
        parent: TreeNode | None = None,
        last_access_time: float = 0.0,
    ) -> None:
        self.key = key
        self.value = _empty_indices() if value is None else value
        self.children: dict[Any, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access_time = last_access_time
        self.hit_count = 0
        self.id = next(_ids)  # tie-breaker for the eviction heap
        self.extra_key: Hashable | None = None  # meaningful on roots only
        self.evicted = False
        #: int64 [len(key)] slots of a second KV tier holding a copy (HiRadixCache); None
        #: when no tier holds this node.
        self.host_value: torch.Tensor | None = None

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref}, "
            f"children={len(self.children)}, t={self.last_access_time:.6f})"
        )


class RadixCache(PrefixCache):
    """Radix-tree `PrefixCache` with page-aligned keys and namespaces.

    page_size: tokens per KV page (>= 1); keys are truncated to a multiple of it and nodes
        split only at page boundaries.
    free_fn: receives int64 slot tensors the cache gives back (eviction, and the caller
        flows of `PrefixCache`); None drops them (tests).
    clock: time source for LRU (seconds, monotonic); injectable for deterministic tests.
    """

    def __init__(
        self,
        page_size: int = 1,
        free_fn: FreeFn | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.free_fn = free_fn
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        self._roots: dict[Hashable | None, TreeNode] = {}
        self._default_root = self._root(None)
        self._leaves: set[TreeNode] = set()
        self._evictable = 0
        self._protected = 0

    # ---- helpers -------------------------------------------------------------------

    def _root(self, extra_key: Hashable | None) -> TreeNode:
        root = self._roots.get(extra_key)
        if root is None:
            root = TreeNode(last_access_time=self.clock())
            root.extra_key = extra_key
            self._roots[extra_key] = root
        return root

    def _normalize(self, key: Sequence[int]) -> Key:
        """Token ids as a tuple of ints, truncated to a page multiple."""
        if isinstance(key, torch.Tensor):
            key = key.tolist()
        return tuple(key[: self.aligned_len(len(key))])

    def _child_key(self, key: Key, pos: int) -> Any:
        return key[pos] if self.page_size == 1 else key[pos : pos + self.page_size]

    def _common_len(self, node_key: Key, key: Key, pos: int) -> int:
        """Page-aligned length of the common prefix of node_key and key[pos:]."""
        n = min(len(node_key), len(key) - pos)
        if node_key[:n] == key[pos : pos + n]:
            return n
        p = self.page_size
        for i in range(0, n, p):
            if node_key[i : i + p] != key[pos + i : pos + i + p]:
                return i
        return n

    def _split(self, node: TreeNode, k: int) -> TreeNode:
        """Split `node` after k tokens; returns the new parent holding key[:k].

        `node` keeps its identity (and its lock_ref) as the lower part, so a path
        root..node a caller locked still covers the same tokens.
        """
        parent = node.parent
        assert parent is not None and 0 < k < len(node.key) and k % self.page_size == 0
        top = TreeNode(node.key[:k], node.value[:k].clone(), parent, node.last_access_time)
        top.lock_ref = node.lock_ref
        top.hit_count = node.hit_count
        parent.children[self._child_key(node.key, 0)] = top
        node.key = node.key[k:]
        node.value = node.value[k:].clone()
        node.parent = top
        top.children[self._child_key(node.key, 0)] = node
        return top

    def _walk(self, root: TreeNode, key: Key, now: float) -> tuple[TreeNode, int, list]:
        """Follow `key` from root, splitting where the match ends inside a node.

        Returns (deepest matched node, matched length, values along the path). Touches
        every matched node's last_access_time.
        """
        node, pos, values = root, 0, []
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            k = self._common_len(child.key, key, pos)
            if k == 0:
                break
            if k < len(child.key):
                child = self._split(child, k)
            child.last_access_time = now
            values.append(child.value)
            node, pos = child, pos + k
        return node, pos, values

    # ---- PrefixCache ---------------------------------------------------------------

    def match_prefix(self, key: Sequence[int], extra_key: Hashable | None = None) -> MatchResult:
        """Longest cached page-aligned prefix of `key`; see `PrefixCache.match_prefix`.

        Returns MatchResult(int64 [matched_len], last_node); an empty match gives the
        namespace root (or the default root when the namespace has no entries).
        """
        tkey = self._normalize(key)
        root = self._roots.get(extra_key)
        if root is None or not tkey:
            return MatchResult(_empty_indices(), root if root is not None else self._default_root)
        node, _, values = self._walk(root, tkey, self.clock())
        n = node
        while not n.is_root:
            n.hit_count += 1
            n = n.parent
        kv = torch.cat(values) if values else _empty_indices()
        return MatchResult(kv, node)

    def insert(
        self, key: Sequence[int], kv_indices: torch.Tensor, extra_key: Hashable | None = None
    ) -> int:
        """See `PrefixCache.insert`: returns the already-cached length m; owns [m:n] after."""
        tkey = self._normalize(key)
        n = len(tkey)
        if n == 0:
            return 0
        if len(kv_indices) < n:
            raise ValueError(f"insert: {len(kv_indices)} kv indices for {n} tokens")
        now = self.clock()
        node, m, _ = self._walk(self._root(extra_key), tkey, now)
        if m < n:
            leaf = TreeNode(tkey[m:], kv_indices[m:n].to(torch.int64, copy=True), node, now)
            node.children[self._child_key(tkey, m)] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            self._evictable += n - m
        return m

    def lock(self, node: TreeNode) -> None:
        """Increment lock_ref on node..root (root excluded). Locking a root is a no-op.

        Raises RuntimeError for an evicted node.
        """
        if node.evicted:
            raise RuntimeError(f"lock on evicted node {node!r}")
        while not node.is_root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                self._leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Decrement lock_ref on node..root (root excluded). Unlocking a root is a no-op.

        Raises RuntimeError if the node is not locked (or was evicted).
        """
        if not node.is_root and (node.lock_ref <= 0 or node.evicted):
            raise RuntimeError(f"unlock on unlocked node {node!r}")
        while not node.is_root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self._leaves.add(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves, least recently used first, until `num_tokens` are freed.

        Calls free_fn(node.value) per evicted node; returns the tokens freed (may exceed
        num_tokens by part of the last node, or fall short if too little is unlocked).
        """
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access_time, n.id, n) for n in self._leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None and node.lock_ref == 0 and not node.children
            del parent.children[self._child_key(node.key, 0)]
            self._leaves.discard(node)
            self._evictable -= len(node.key)
            freed += len(node.key)
            node.evicted = True
            if self.free_fn is not None:
                self.free_fn(node.value)
            if parent.is_root:
                if not parent.children and parent.extra_key is not None:
                    del self._roots[parent.extra_key]
            elif not parent.children and parent.lock_ref == 0:
                self._leaves.add(parent)
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        logger.debug("evicted %d tokens (asked %d)", freed, num_tokens)
        return freed

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    # ---- introspection -------------------------------------------------------------

    def iter_nodes(self) -> Iterator[tuple[Hashable | None, TreeNode]]:
        """Every non-root node as (extra_key, node), parents before children."""
        for extra_key, root in self._roots.items():
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                yield extra_key, node
                stack.extend(node.children.values())

    def format_tree(self) -> str:
        """Multi-line text dump of every namespace (debugging)."""
        lines: list[str] = []

        def rec(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                head = list(child.key[:8]) + (["..."] if len(child.key) > 8 else [])
                lines.append(f"{'  ' * depth}{head} len={len(child.key)} lock={child.lock_ref}")
                rec(child, depth + 1)

        for extra_key, root in self._roots.items():
            lines.append(f"[extra_key={extra_key!r}]")
            rec(root, 1)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, evictable={self._evictable}, "
            f"protected={self._protected}, namespaces={len(self._roots)})"
        )
