"""Unit tests for HiRadixCache: where each node's KV lives, eviction into the second tier,
load-back, tier LRU, write policies and failed page checks.

The "KV" of a slot is the token id it holds (`Store.data`), so every load can be checked
against the key it was matched for.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.radix import HiRadixCache, make_prefix_cache
from radixlm.runtime.executor.memory import PagedAllocator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class FakeTier:
    """A tier whose slots hold token ids; pages listed in `bad` fail their check."""

    def __init__(self, tokens: int, page_size: int, pool_data: torch.Tensor):
        self.page_size = page_size
        self.total = tokens
        self.alloc_ = PagedAllocator(tokens, page_size)
        self.data = torch.full((tokens + page_size,), -1, dtype=torch.int64)
        self.pool_data = pool_data
        self.bad: set[int] = set()

    def available(self) -> int:
        return self.alloc_.available()

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.available():
            return None
        pages = self.alloc_.alloc_pages(n // self.page_size)
        return (pages[:, None] * self.page_size + torch.arange(self.page_size)).flatten()

    def free(self, slots: torch.Tensor) -> None:
        self.alloc_.free(slots)

    def reset(self) -> None:
        self.alloc_ = PagedAllocator(self.total, self.page_size)

    def write(self, pool_slots: torch.Tensor, tier_slots: torch.Tensor) -> None:
        self.data[tier_slots] = self.pool_data[pool_slots]

    def read(self, tier_slots: torch.Tensor, pool_slots: torch.Tensor) -> bool:
        if set((tier_slots // self.page_size).tolist()) & self.bad:
            return False
        self.pool_data[pool_slots] = self.data[tier_slots]
        return True

    def stats(self) -> dict:
        return {}


class Env:
    """A primary pool of `primary` tokens, a tier of `tier` tokens and the cache."""

    def __init__(self, primary: int, tier: int, page_size: int = 1, policy="write_through"):
        self.ps = page_size
        self.alloc = PagedAllocator(primary, page_size)
        self.data = torch.full((primary + page_size,), -1, dtype=torch.int64)
        self.tier = FakeTier(tier, page_size, self.data)
        self.cache = HiRadixCache(
            page_size,
            self.alloc.free,
            tier=self.tier,
            allocator=self.alloc,
            write_policy=policy,
            clock=Clock(),
        )

    def run(self, key: list[int]) -> int:
        """One request over `key`: load back, compute the rest into fresh slots, cache it.
        Returns the tokens it reused (primary + loaded); checks the reused KV."""
        c = self.cache
        match, _ = c.load_back(key, None, room=10**9)
        p = len(match.kv_indices)
        assert self.data[match.kv_indices].tolist() == key[:p]
        c.lock(match.last_node)
        n = len(key) - len(key) % self.ps
        short = (n - p) - self.alloc.available()
        if short > 0:
            c.evict(short)
        pages = self.alloc.alloc_pages((n - p) // self.ps)
        slots = (pages[:, None] * self.ps + torch.arange(self.ps)).flatten()
        self.data[slots] = torch.tensor(key[p:n], dtype=torch.int64)
        c.cache_finished(key, torch.cat([match.kv_indices, slots]), p, match.last_node)
        return p

    def check(self) -> None:
        """The module docstring's invariants, the pool's and the tier's accounting, and
        that every node's slots in either tier hold its key."""
        c = self.cache
        nodes = [n for _, n in c.iter_nodes()]
        leaves, host_nodes, ev, pr = set(), set(), 0, 0
        for n in nodes:
            k = len(n.key)
            primary = n.value.numel() > 0
            assert primary or n.host_value is not None, n
            assert len(n.value) in (0, k) and (n.host_value is None or len(n.host_value) == k)
            if primary:
                assert self.data[n.value].tolist() == list(n.key)
                assert n.parent.is_root or n.parent.value.numel() > 0, "primary under tier-only"
                ev += k * (n.lock_ref == 0)
                pr += k * (n.lock_ref > 0)
                if n.lock_ref == 0 and not any(x.value.numel() for x in n.children.values()):
                    leaves.add(n)
            if n.host_value is not None:
                host_nodes.add(n)
                assert self.tier.data[n.host_value].tolist() == list(n.key)
        assert c._leaves == leaves and c._host_nodes == host_nodes
        # the tier's LRU heap: a current entry per tier node, stale entries bounded
        current = {(t, x) for t, _, x in c._host_heap if x in host_nodes}
        assert all((n.last_access_time, n) in current for n in host_nodes)
        assert len(c._host_heap) <= 2 * len(host_nodes) + 65
        assert (c.evictable_size(), c.protected_size()) == (ev, pr)
        assert self.alloc.available() + ev + pr == self.alloc.total
        acc = c.tier_accounting()
        assert acc["tier_used"] == sum(len(n.host_value) for n in host_nodes)
        assert acc["tier_total"] == acc["tier_free"] + acc["tier_used"] == self.tier.total


def test_make_prefix_cache_builds_the_tiered_cache() -> None:
    env = Env(8, 8)
    c = make_prefix_cache(False, 1, env.alloc.free, tier=env.tier, allocator=env.alloc)
    assert isinstance(c, HiRadixCache) and c.write_through
    with pytest.raises(ValueError):
        make_prefix_cache(False, 1, None, tier=env.tier)
    with pytest.raises(ValueError):
        HiRadixCache(1, None, tier=env.tier, allocator=env.alloc, write_policy="later")


def test_evicted_prefix_stays_in_tier_and_loads_back() -> None:
    env = Env(primary=8, tier=32)
    c = env.cache
    assert env.run([1, 2, 3, 4, 5, 6]) == 0
    assert c.host_size() == 6  # write_through: copied when cached
    assert c.evict(6) == 6
    env.check()
    assert c.evictable_size() == 0 and c.match_prefix([1, 2, 3, 4, 5, 6]).kv_indices.numel() == 0
    node = next(n for _, n in c.iter_nodes())
    assert node.value.numel() == 0 and node.host_value is not None  # tier-only, kept
    match, loaded = c.load_back([1, 2, 3, 4, 9], None, room=100)
    assert loaded == 4 and env.data[match.kv_indices].tolist() == [1, 2, 3, 4]
    assert c.evictable_size() == 4 and c.loaded_tokens == 4
    env.check()
    # the split-off tail [5, 6] is still tier-only, under the loaded node
    assert c.match_prefix([1, 2, 3, 4, 5, 6]).kv_indices.numel() == 4
    assert env.run([1, 2, 3, 4, 5, 6, 7]) == 6
    env.check()


def test_load_back_respects_room() -> None:
    env = Env(primary=8, tier=32)
    env.run([1, 2, 3, 4])
    env.cache.evict(4)
    match, loaded = env.cache.load_back([1, 2, 3, 4, 5], None, room=3)
    assert loaded == 0 and match.kv_indices.numel() == 0 and match.last_node.is_root
    env.check()


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_write_policies(policy: str) -> None:
    env = Env(primary=8, tier=32, policy=policy)
    env.run([1, 2, 3, 4])
    assert env.cache.host_size() == (4 if policy == "write_through" else 0)
    env.run([7, 8, 9, 10, 11, 12])  # evicts [1..4]: written now under write_back
    assert env.cache.host_size() == 10 if policy == "write_through" else 4
    env.check()
    assert env.run([1, 2, 3, 4, 5]) == 4  # served from the tier either way
    env.check()


def test_tier_lru_deletes_oldest_tier_only_nodes() -> None:
    env = Env(primary=4, tier=8, policy="write_back")
    c = env.cache
    for first in (10, 20, 30):  # each evicts the one before into the 8-token tier
        env.run([first, first + 1, first + 2, first + 3])
        env.check()
    env.run([40, 41, 42, 43])  # the tier is full: the oldest ([10..]) is deleted
    env.check()
    assert c.tier_accounting()["tier_used"] == 8
    assert env.run([10, 11, 12, 13]) == 0  # gone from both tiers
    assert env.run([30, 31, 32, 33]) == 4  # still in the tier
    env.check()


def test_write_through_tier_full_keeps_primary_nodes() -> None:
    env = Env(primary=16, tier=4)
    env.run([1, 2, 3, 4])
    env.run([5, 6, 7, 8])  # the tier drops [1..4]'s host copy (LRU), the node stays primary
    env.check()
    assert env.cache.evictable_size() == 8 and env.cache.host_size() == 4
    # LRU: [1..4] is written back over [5..8]'s host copy, then [5..8] over [1..4]
    assert env.cache.evict(8) == 8
    env.check()
    assert env.run([5, 6, 7, 8]) == 4 and env.run([1, 2, 3, 4]) == 0


def test_failed_page_check_deletes_and_recomputes() -> None:
    env = Env(primary=8, tier=32, page_size=2)
    c = env.cache
    env.run([1, 2, 3, 4])
    env.run([1, 2, 3, 4, 5, 6])
    c.evict(8)
    tail = next(n for _, n in c.iter_nodes() if n.key == (5, 6))
    env.tier.bad.add(int(tail.host_value[0]) // 2)
    match, loaded = c.load_back([1, 2, 3, 4, 5, 6, 7], None, room=100)
    assert loaded == 4 and env.data[match.kv_indices].tolist() == [1, 2, 3, 4]
    assert c.dropped_tokens == 2 and tail.evicted
    env.check()
    assert env.run([1, 2, 3, 4, 5, 6, 7]) == 4  # [5, 6] recomputed, never served
    env.check()


def test_insert_adopts_tier_only_nodes() -> None:
    env = Env(primary=8, tier=32)
    c = env.cache
    env.run([1, 2, 3, 4])
    c.evict(4)
    slots = env.alloc.alloc_pages(5)
    env.data[slots] = torch.tensor([1, 2, 3, 4, 5])
    assert c.insert([1, 2, 3, 4, 5], slots) == 0  # the cache owns all five slots
    env.check()
    assert c.match_prefix([1, 2, 3, 4, 5]).kv_indices.tolist() == slots.tolist()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_random_multi_turn_sessions(page_size: int, policy: str) -> None:
    """Agent sessions growing turn by turn over a pool far smaller than their history:
    every reuse is checked against its key, and the invariants hold after every turn."""
    rnd = random.Random(page_size)
    env = Env(primary=16 * page_size, tier=64 * page_size, page_size=page_size, policy=policy)
    history: dict[int, list[int]] = {s: [100 * s] * page_size for s in range(6)}
    reused = 0
    for _ in range(60):
        s = rnd.randrange(6)
        turn = [rnd.randrange(1000) for _ in range(rnd.randrange(1, 4 * page_size))]
        key = history[s] + turn
        if len(key) > 12 * page_size:
            key = key[:page_size] + turn  # a new branch off the session's first page
        reused += env.run(key)
        history[s] = key
        env.check()
    assert reused > 0 and env.cache.loaded_tokens > 0
