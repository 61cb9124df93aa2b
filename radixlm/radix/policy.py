"""Scheduling policies over the waiting queue, and in-batch prefix sharing.

A policy orders the waiting queue before each admission round; the scheduler admits in
that order until a budget runs out. Policies are strategy objects registered by name
(``--schedule-policy``):

* ``fcfs``: arrival order.
* ``lof``: longest output first (largest remaining ``max_new_tokens``); ties by arrival.
* ``random``: a seeded shuffle.
* ``lpm``: longest prefix match first -- requests whose prompt shares the longest cached
  prefix run first, so that prefix is reused before eviction can take it (SGLang,
  Zheng et al. 2024, "SGLang: Efficient Execution of Structured Language Model
  Programs", NeurIPS, section 3: "cache-aware scheduling").
* ``dfs-weight``: a depth-first walk of the radix tree, visiting at every node the child
  subtree with the most waiting requests first; requests come out grouped by shared
  prefix (same paper; SGLang's ``dfs-weight`` policy).

The cache-aware policies (lpm, dfs-weight) match every waiting prompt against the tree,
O(queue length x prompt length) per round, so they fall back to fcfs when the queue is
longer than ``fallback_queue_len`` (``--schedule-fallback-queue-len``) or when the cache
is a `NoCache`.

Waiting items are duck-typed: they need ``all_ids`` (token ids to prefill: prompt plus
any output kept across a retraction), ``extra_key`` (cache namespace) and
``remaining_new_tokens()``.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, TypeVar

from radixlm.radix.base import PrefixCache
from radixlm.radix.radix_cache import RadixCache

T = TypeVar("T")


def match_len(tree: PrefixCache, item: Any) -> int:
    """Cached tokens a waiting item would reuse: the match of all but its last token
    (the last one must run to produce logits), page-aligned."""
    return len(tree.match_prefix(item.all_ids[:-1], item.extra_key).kv_indices)


class SchedulePolicy(abc.ABC):
    """Orders the waiting queue; see the module docstring.

    Args:
        tree: the scheduler's prefix cache (read by cache-aware policies).
        fallback_queue_len: above this many waiting items cache-aware policies use fcfs.
        seed: RNG seed (``random`` policy).
    """

    name: ClassVar[str]
    cache_aware: ClassVar[bool] = False

    def __init__(self, tree: PrefixCache, fallback_queue_len: int = 128, seed: int = 0):
        self.tree = tree
        self.fallback_queue_len = fallback_queue_len
        self.rng = random.Random(seed)

    def order(self, waiting: Sequence[T]) -> list[T]:
        """The items of `waiting` (arrival order) in admission order (a new list)."""
        if self.cache_aware and (
            len(waiting) > self.fallback_queue_len or not isinstance(self.tree, RadixCache)
        ):
            return list(waiting)
        return self._order(list(waiting))

    @abc.abstractmethod
    def _order(self, waiting: list[T]) -> list[T]: ...


class FCFSPolicy(SchedulePolicy):
    """First come, first served."""

    name = "fcfs"

    def _order(self, waiting: list[T]) -> list[T]:
        return waiting


class LOFPolicy(SchedulePolicy):
    """Longest (remaining) output first; stable, so ties keep arrival order."""

    name = "lof"

    def _order(self, waiting: list[T]) -> list[T]:
        return sorted(waiting, key=lambda r: -r.remaining_new_tokens())


class RandomPolicy(SchedulePolicy):
    """A uniformly random order from a seeded RNG."""

    name = "random"

    def _order(self, waiting: list[T]) -> list[T]:
        self.rng.shuffle(waiting)
        return waiting


class LPMPolicy(SchedulePolicy):
    """Longest cached prefix (tokens) first; stable, so ties keep arrival order."""

    name = "lpm"
    cache_aware = True

    def _order(self, waiting: list[T]) -> list[T]:
        lens = {id(r): match_len(self.tree, r) for r in waiting}
        return sorted(waiting, key=lambda r: -lens[id(r)])


class DFSWeightPolicy(SchedulePolicy):
    """Depth-first over the radix tree, heaviest subtree first.

    Each waiting item hangs at the deepest node its prompt matches; a node's weight is
    the number of items in its subtree. The walk visits a node's children by decreasing
    weight (ties: first arrival), then emits the node's own items (arrival order), so
    items sharing cached prefixes are admitted together and items that match nothing
    come last. Namespaces (extra_key roots) are visited by decreasing weight as well.
    """

    name = "dfs-weight"
    cache_aware = True

    def _order(self, waiting: list[T]) -> list[T]:
        at: dict[Any, list[T]] = {}  # node -> items hanging there
        weight: dict[Any, int] = {}
        first: dict[Any, int] = {}  # node -> arrival index of its first item (tie-break)
        for i, item in enumerate(waiting):
            node = self.tree.match_prefix(item.all_ids[:-1], item.extra_key).last_node
            at.setdefault(node, []).append(item)
            while node is not None:
                weight[node] = weight.get(node, 0) + 1
                first.setdefault(node, i)
                node = node.parent

        def heaviest_last(nodes):
            return sorted(nodes, key=lambda n: (weight[n], -first[n]))

        # Post-order (SGLang's get_dfs_priority): a node's subtrees, heaviest first, then
        # the items that match only down to the node itself.
        out: list[T] = []
        stack: list[tuple[Any, bool]] = [
            (n, False) for n in heaviest_last(n for n in weight if n.parent is None)
        ]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                out.extend(at.get(node, ()))
                continue
            stack.append((node, True))
            kids = [c for c in node.children.values() if c in weight]
            stack.extend((c, False) for c in heaviest_last(kids))
        return out


POLICIES: dict[str, type[SchedulePolicy]] = {
    cls.name: cls for cls in (LPMPolicy, DFSWeightPolicy, FCFSPolicy, LOFPolicy, RandomPolicy)
}


def make_policy(
    name: str, tree: PrefixCache, fallback_queue_len: int = 128, seed: int = 0
) -> SchedulePolicy:
    """The policy registered as `name`. Raises ValueError for an unknown name."""
    try:
        cls = POLICIES[name]
    except KeyError:
        choices = sorted(POLICIES)
        raise ValueError(f"unknown schedule policy {name!r}; choose from {choices}") from None
    return cls(tree, fallback_queue_len, seed)


class InBatchPrefixGuard:
    """Staggers requests that share a prefix nobody has computed yet (in-batch sharing).

    Two requests admitted in the same step both miss the cache on a prefix they share,
    so it would be prefilled twice. The guard remembers the prompts being prefilled in
    this step (and the request mid-chunk); `conflicts` is true when a candidate shares at
    least `threshold` page-aligned tokens beyond its own cached prefix with one of them.
    The scheduler then defers the candidate by one round: by then the shared prefix is
    in the cache and it hits (SGLang's in-batch prefix caching, threshold 32 tokens).

    Args:
        page_size: tokens per KV page (shared lengths are rounded down to a page).
        threshold: minimum shared uncached tokens worth waiting for.
    """

    def __init__(self, page_size: int = 1, threshold: int = 32):
        self.page_size = page_size
        self.threshold = threshold
        self._seqs: list[tuple[Hashable | None, Sequence[int]]] = []

    def add(self, ids: Sequence[int], extra_key: Hashable | None) -> None:
        """Record a prompt (token ids) whose KV this step is computing."""
        self._seqs.append((extra_key, ids))

    def conflicts(self, ids: Sequence[int], cached_len: int, extra_key: Hashable | None) -> bool:
        """Whether `ids` (cached for `cached_len` tokens) should wait for a recorded prompt."""
        key = ids[:-1]
        for ns, seq in self._seqs:
            if ns != extra_key:
                continue
            n = _common_prefix_len(key, seq)
            if n - n % self.page_size - cached_len >= self.threshold:
                return True
        return False


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo
