"""Which replica (or worker) serves a request: the data-parallel dispatch policies.

One interface, `DispatchPolicy.choose(key, candidates, loads)`, serves two callers: the
TokenizerManager of `radixlm serve --dp-size N` (replicas are scheduler processes, the key
is the prompt's token ids) and `radixlm router` (replicas are worker servers, the key is
the request's text as Unicode code points, or its token ids when it sends them).

Policies (`--dp-policy`, `radixlm router --policy`):

* ``round_robin``: the next candidate after the last one chosen.
* ``least_load``: the candidate with the fewest requests in flight (ties: lowest rank).
* ``cache_aware`` (default): after SGLang's cache-aware router. Each replica has an
  approximate radix tree (`radixlm.radix.RadixCache` with no KV behind it) of the keys
  routed to it; a request goes to the candidate whose tree matches the longest prefix of
  its key (ties: the least loaded, then the smallest tree, so unrelated prompts spread).
  When the loads are imbalanced (the busiest candidate has more than `balance_threshold`
  requests more than the idlest) it goes to the least loaded one instead, and its key
  still enters that replica's tree. A tree holds at most
  `max_tree_tokens` tokens; inserting past that evicts its least recently matched leaves,
  standing in for the replica's own LRU eviction, which the router cannot see.

Load is the number of requests the caller has sent to a replica that have not finished
(what the replica holds as running + waiting, plus the ones on their way to it). The
caller counts it, so a burst of requests sees every earlier one at once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from radixlm.radix.radix_cache import RadixCache

#: Policy names, in `--dp-policy` order (the first is the default).
POLICIES = ("cache_aware", "round_robin", "least_load")


class DispatchPolicy:
    """Chooses one of `num_replicas` replicas (ranks 0..num_replicas-1) per request.

    Subclasses implement `choose`; a policy that learns from what it routed also
    implements `forget` and `forget_rank` (no-ops here)."""

    name: str

    def __init__(self, num_replicas: int):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.num_replicas = num_replicas

    def choose(
        self,
        key: Sequence[int],
        candidates: Sequence[int],
        loads: Sequence[int],
        namespace: Hashable | None = None,
    ) -> int:
        """The rank to send a request to.

        key: the request's token ids (or text code points); namespace: its cache
        namespace (a cache salt), whose prefixes are never shared with another one;
        candidates: ranks that may take it (non-empty, ascending); loads[r]: requests in
        flight on rank r (indexed by rank, all ranks). Raises ValueError when
        `candidates` is empty.
        """
        raise NotImplementedError

    def forget(self) -> None:
        """Drop what the policy learned about the replicas' caches (after a flush)."""

    def forget_rank(self, rank: int) -> None:
        """Drop what the policy learned about one replica (it restarted: its cache is empty)."""


def _least_loaded(candidates: Sequence[int], loads: Sequence[int]) -> int:
    if not candidates:
        raise ValueError("no replica to dispatch to")
    return min(candidates, key=lambda r: (loads[r], r))


class RoundRobin(DispatchPolicy):
    """Candidates in turn: the first candidate rank after the last rank chosen."""

    name = "round_robin"

    def __init__(self, num_replicas: int):
        super().__init__(num_replicas)
        self._last = -1

    def choose(self, key, candidates, loads, namespace=None) -> int:
        if not candidates:
            raise ValueError("no replica to dispatch to")
        after = [r for r in candidates if r > self._last]
        self._last = after[0] if after else candidates[0]
        return self._last


class LeastLoad(DispatchPolicy):
    """The candidate with the fewest requests in flight (ties: lowest rank)."""

    name = "least_load"

    def choose(self, key, candidates, loads, namespace=None) -> int:
        return _least_loaded(candidates, loads)


class CacheAware(DispatchPolicy):
    """Longest approximate prefix match, unless loads are imbalanced (module docstring).

    balance_threshold: requests in flight by which the busiest candidate may exceed the
    idlest before routing falls back to the least loaded (>= 0).
    max_tree_tokens: tokens each replica's approximate tree keeps (>= 1).
    """

    name = "cache_aware"

    def __init__(
        self, num_replicas: int, balance_threshold: int = 4, max_tree_tokens: int = 1 << 20
    ):
        super().__init__(num_replicas)
        if balance_threshold < 0:
            raise ValueError(f"balance_threshold must be >= 0, got {balance_threshold}")
        if max_tree_tokens < 1:
            raise ValueError(f"max_tree_tokens must be >= 1, got {max_tree_tokens}")
        self.balance_threshold = balance_threshold
        self.max_tree_tokens = max_tree_tokens
        self.trees = [RadixCache() for _ in range(num_replicas)]

    def matched(self, rank: int, key: Sequence[int], namespace: Hashable | None = None) -> int:
        """Tokens of `key` that rank's tree holds as a prefix (marks them recently used)."""
        return len(self.trees[rank].match_prefix(key, namespace).kv_indices)

    def choose(self, key, candidates, loads, namespace=None) -> int:
        least = _least_loaded(candidates, loads)
        busiest = max(loads[r] for r in candidates)
        if busiest - loads[least] > self.balance_threshold:
            rank = least
        else:
            rank = max(candidates, key=lambda r: self._preference(r, key, loads, namespace))
        self._insert(rank, key, namespace)
        return rank

    def _preference(self, rank, key, loads, namespace) -> tuple[int, int, int, int]:
        """Longest match first; then fewest in flight, smallest tree (so unrelated
        prompts spread over the replicas), lowest rank."""
        matched = self.matched(rank, key, namespace)
        return (matched, -loads[rank], -self.tree_tokens(rank), -rank)

    def _insert(self, rank: int, key: Sequence[int], namespace: Hashable | None) -> None:
        if not key:
            return
        key = key[: self.max_tree_tokens]
        tree = self.trees[rank]
        tree.insert(key, torch.zeros(len(key), dtype=torch.int64), namespace)
        over = tree.evictable_size() - self.max_tree_tokens
        if over > 0:
            tree.evict(over)

    def tree_tokens(self, rank: int) -> int:
        """Tokens held in rank's approximate tree."""
        return self.trees[rank].evictable_size()

    def forget(self) -> None:
        for tree in self.trees:
            tree.reset()

    def forget_rank(self, rank: int) -> None:
        self.trees[rank].reset()


def make_policy(
    name: str, num_replicas: int, *, balance_threshold: int = 4, max_tree_tokens: int = 1 << 20
) -> DispatchPolicy:
    """The policy called `name` (one of POLICIES). Raises ValueError for another name."""
    if name == "cache_aware":
        return CacheAware(num_replicas, balance_threshold, max_tree_tokens)
    if name == "round_robin":
        return RoundRobin(num_replicas)
    if name == "least_load":
        return LeastLoad(num_replicas)
    raise ValueError(f"unknown dispatch policy {name!r}; choose one of {', '.join(POLICIES)}")
