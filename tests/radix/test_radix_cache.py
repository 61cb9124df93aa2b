"""Unit tests for RadixCache."""

from __future__ import annotations

import pytest
import torch

from radixlm.radix import MatchResult, RadixCache, make_prefix_cache


class Clock:
    """Deterministic time source: advance by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += 1.0


def kv(*slots: int) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64)


def rng(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int64)


@pytest.fixture
def freed() -> list[int]:
    return []


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(freed: list[int], clock: Clock, page_size: int = 1) -> RadixCache:
    return RadixCache(page_size, lambda t: freed.extend(t.tolist()), clock=clock)


def test_empty_tree_and_empty_key(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    for key in ([1, 2, 3], []):
        r = c.match_prefix(key)
        assert isinstance(r, MatchResult)
        assert r.kv_indices.dtype == torch.int64 and r.kv_indices.numel() == 0
        assert r.last_node.is_root
    c.insert([1, 2], kv(5, 6))
    r = c.match_prefix([])
    assert r.kv_indices.numel() == 0 and r.last_node.is_root
    assert c.insert([], kv()) == 0
    c.lock(r.last_node)  # root: no-op
    c.unlock(r.last_node)
    assert c.protected_size() == 0 and c.evictable_size() == 2


def test_exact_and_longer_match(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    assert c.insert([1, 2, 3], kv(10, 11, 12)) == 0
    r = c.match_prefix([1, 2, 3])
    assert r.kv_indices.tolist() == [10, 11, 12]
    assert r.last_node.key == (1, 2, 3)
    assert c.match_prefix([1, 2, 3, 4, 5]).kv_indices.tolist() == [10, 11, 12]
    assert c.match_prefix([2, 3]).kv_indices.numel() == 0
    assert c.evictable_size() == 3


def test_partial_match_splits_node(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3, 4], kv(10, 11, 12, 13))
    r = c.match_prefix([1, 2, 9])
    assert r.kv_indices.tolist() == [10, 11]
    assert r.last_node.key == (1, 2)
    (child,) = r.last_node.children.values()
    assert child.key == (3, 4) and child.value.tolist() == [12, 13]
    assert child.parent is r.last_node
    assert c.match_prefix([1, 2, 3, 4]).kv_indices.tolist() == [10, 11, 12, 13]
    assert c.evictable_size() == 4 and c.protected_size() == 0


def test_insert_returns_already_cached_length(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    assert c.insert([1, 2, 3], kv(10, 11, 12)) == 0
    assert c.insert([1, 2, 3, 4, 5], kv(20, 21, 22, 23, 24)) == 3
    # the cache keeps its own slots for the cached prefix, and takes the new ones
    assert c.match_prefix([1, 2, 3, 4, 5]).kv_indices.tolist() == [10, 11, 12, 23, 24]
    assert c.insert([1, 2, 7], kv(30, 31, 32)) == 2  # diverges inside a node
    assert c.match_prefix([1, 2, 7]).kv_indices.tolist() == [10, 11, 32]
    assert c.insert([1, 2], kv(40, 41)) == 2
    assert c.evictable_size() == 6
    with pytest.raises(ValueError):
        c.insert([5, 6, 7], kv(1, 2))


def test_insert_copies_values(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    row = torch.tensor([7, 8, 9], dtype=torch.int64)
    c.insert([1, 2, 3], row)
    row[:] = 0
    assert c.match_prefix([1, 2, 3]).kv_indices.tolist() == [7, 8, 9]
    c.insert([4, 5], torch.tensor([3, 4], dtype=torch.int32))
    assert c.match_prefix([4, 5]).kv_indices.dtype == torch.int64


@pytest.mark.parametrize("page", [4, 16])
def test_page_alignment(freed: list[int], clock: Clock, page: int) -> None:
    c = make(freed, clock, page_size=page)
    key = list(range(100, 100 + 3 * page + 3))  # 3 pages + a partial one
    assert c.insert(key, rng(1000, len(key))) == 0
    assert c.evictable_size() == 3 * page  # partial page not cached
    r = c.match_prefix(key)
    assert r.kv_indices.tolist() == list(range(1000, 1000 + 3 * page))
    # a key diverging inside page 2 matches only one page and splits at that boundary
    other = key[: page + 1] + [-1] * (2 * page)
    r = c.match_prefix(other)
    assert len(r.kv_indices) == page
    assert len(r.last_node.key) == page
    assert all(len(n.key) % page == 0 for _, n in c.iter_nodes())
    for _, n in c.iter_nodes():
        for ck, child in n.children.items():
            assert ck == child.key[:page]
    assert c.insert(other, rng(5000, len(other))) == page
    assert c.evictable_size() == 3 * page + 2 * page
    assert c.match_prefix(key[: page - 1]).kv_indices.numel() == 0  # shorter than a page


def test_extra_key_namespaces(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3], kv(10, 11, 12))
    c.insert([1, 2, 3], kv(20, 21, 22), extra_key="lora-a")
    assert c.match_prefix([1, 2, 3]).kv_indices.tolist() == [10, 11, 12]
    assert c.match_prefix([1, 2, 3], extra_key="lora-a").kv_indices.tolist() == [20, 21, 22]
    assert c.match_prefix([1, 2, 3], extra_key="salt").kv_indices.numel() == 0
    assert c.evictable_size() == 6
    assert c.evict(6) == 6
    assert sorted(freed) == [10, 11, 12, 20, 21, 22]
    assert c.match_prefix([1, 2, 3], extra_key="lora-a").kv_indices.numel() == 0


def test_lock_unlock_sizes(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3, 4], rng(10, 4))
    c.insert([1, 2, 5, 6, 7], rng(20, 5))  # splits into [1,2] / [3,4] / [5,6,7]
    a = c.match_prefix([1, 2, 3, 4]).last_node
    b = c.match_prefix([1, 2, 5, 6, 7]).last_node
    assert (c.evictable_size(), c.protected_size()) == (7, 0)
    c.lock(a)
    assert (c.evictable_size(), c.protected_size()) == (3, 4)
    c.lock(b)
    assert (c.evictable_size(), c.protected_size()) == (0, 7)
    c.lock(a)
    c.unlock(a)
    assert (c.evictable_size(), c.protected_size()) == (0, 7)
    c.unlock(b)
    assert (c.evictable_size(), c.protected_size()) == (3, 4)
    c.unlock(a)
    assert (c.evictable_size(), c.protected_size()) == (7, 0)


def test_lock_survives_split(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3, 4], rng(10, 4))
    node = c.match_prefix([1, 2, 3, 4]).last_node
    c.lock(node)
    c.match_prefix([1, 2])  # splits the locked node
    assert c.protected_size() == 4 and c.evictable_size() == 0
    assert node.parent.lock_ref == 1
    c.unlock(node)
    assert c.protected_size() == 0 and c.evictable_size() == 4


def test_unlock_errors(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2], kv(1, 2))
    node = c.match_prefix([1, 2]).last_node
    with pytest.raises(RuntimeError):
        c.unlock(node)
    c.lock(node)
    c.unlock(node)
    with pytest.raises(RuntimeError):
        c.unlock(node)
    c.evict(2)
    with pytest.raises(RuntimeError):
        c.lock(node)


def test_eviction_lru_order(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3], kv(10, 11, 12))
    clock.tick()
    c.insert([1, 2, 4], kv(10, 11, 13))  # shares [1,2]: returns 2 (caller frees its dups)
    clock.tick()
    c.insert([5, 6], kv(20, 21))
    clock.tick()
    c.match_prefix([1, 2, 3])  # refresh [1,2] and [3]
    # leaves by age: [4] (t=1), [5,6] (t=2), [3] (t=3); [1,2] becomes a leaf last
    assert c.evict(1) == 1 and freed == [13]
    assert c.evict(1) == 2 and freed == [13, 20, 21]
    assert c.evict(2) == 3 and freed == [13, 20, 21, 12, 10, 11]
    assert c.evictable_size() == 0
    assert c.evict(5) == 0
    assert c.match_prefix([1, 2, 3]).kv_indices.numel() == 0


def test_locked_nodes_never_evicted(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3], kv(10, 11, 12))
    clock.tick()
    c.insert([1, 2, 4, 5], kv(10, 11, 14, 15))
    node = c.match_prefix([1, 2, 3]).last_node
    c.lock(node)
    assert c.evict(100) == 2  # only [4,5]
    assert sorted(freed) == [14, 15]
    assert c.match_prefix([1, 2, 3]).kv_indices.tolist() == [10, 11, 12]
    assert (c.evictable_size(), c.protected_size()) == (0, 3)
    c.unlock(node)
    assert c.evict(100) == 3
    assert c.total_size() == 0


def test_evict_partial_request_stops_early(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    for i in range(5):
        c.insert([i, 100], kv(2 * i, 2 * i + 1))
        clock.tick()
    assert c.evict(3) == 4  # whole nodes: two 2-token leaves
    assert sorted(freed) == [0, 1, 2, 3]
    assert c.evict(0) == 0


def test_reset(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3], kv(1, 2, 3))
    c.insert([1], kv(4), extra_key="x")
    c.lock(c.match_prefix([1, 2]).last_node)
    c.reset()
    assert freed == []
    assert c.evictable_size() == 0 and c.protected_size() == 0
    assert c.match_prefix([1, 2, 3]).kv_indices.numel() == 0
    assert list(c.iter_nodes()) == []
    assert c.insert([1, 2, 3], kv(1, 2, 3)) == 0


def test_tensor_keys_and_format(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert(torch.tensor([1, 2, 3]), kv(1, 2, 3))
    assert c.match_prefix(torch.tensor([1, 2])).kv_indices.tolist() == [1, 2]
    assert "len=2" in c.format_tree() and "RadixCache" in repr(c)


def test_hit_count(freed: list[int], clock: Clock) -> None:
    c = make(freed, clock)
    c.insert([1, 2, 3], kv(1, 2, 3))
    c.match_prefix([1, 2, 3])
    node = c.match_prefix([1, 2, 3]).last_node
    assert node.hit_count == 2


def test_caller_flows(freed: list[int], clock: Clock) -> None:
    """cache_unfinished / cache_finished / release follow the documented ownership."""
    c = make(freed, clock)
    c.insert([1, 2, 3], kv(10, 11, 12))
    # request: prompt [1,2,3,4,5], matched 3, allocated 2 own slots, 1 extra decode slot
    r = c.match_prefix([1, 2, 3, 4, 5])
    c.lock(r.last_node)
    row = torch.cat([r.kv_indices, kv(50, 51, 52)])
    # another request caches [1,2,3,4] meanwhile with its own slot 60
    assert c.insert([1, 2, 3, 4], kv(10, 11, 12, 60)) == 3
    up = c.cache_unfinished([1, 2, 3, 4, 5], row, 3, r.last_node)
    assert freed == [50]  # duplicate of the cache's slot 60
    assert up.prefix_len == 5 and up.kv_indices.tolist() == [10, 11, 12, 60, 51, 52]
    assert c.protected_size() == 5 and c.evictable_size() == 0
    c.cache_finished([1, 2, 3, 4, 5, 6], up.kv_indices, up.prefix_len, up.last_node)
    assert freed == [50]  # slot 52 now cached under token 6
    assert c.match_prefix([1, 2, 3, 4, 5, 6]).kv_indices.tolist() == [10, 11, 12, 60, 51, 52]
    assert (c.evictable_size(), c.protected_size()) == (6, 0)
    # finish with a key-less tail slot: it is freed
    r = c.match_prefix([1, 2, 7])
    c.lock(r.last_node)
    c.cache_finished([1, 2, 7], torch.cat([r.kv_indices, kv(70, 71)]), 2, r.last_node)
    assert freed == [50, 71]
    # abort
    r = c.match_prefix([1, 2, 9])
    c.lock(r.last_node)
    c.release(torch.cat([r.kv_indices, kv(80)]), 2, r.last_node)
    assert freed == [50, 71, 80] and c.protected_size() == 0


def test_factory() -> None:
    assert isinstance(make_prefix_cache(False, 4, None), RadixCache)
    assert make_prefix_cache(False, 4, None).page_size == 4
    with pytest.raises(ValueError):
        RadixCache(page_size=0)
