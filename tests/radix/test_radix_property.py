"""Stateful property test of RadixCache against a brute-force token-level reference.

The reference maps every cached (extra_key, page-aligned token prefix) to [slots of its
last page, last access time]. It mirrors inserts, matches and LRU eviction; after every step the
tree must hold exactly the reference's contents, and a simulated slot allocator must
satisfy free + evictable + protected + held == total with all four sets disjoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlm.radix import RadixCache

TOTAL = 120
NAMESPACES = [None, "adapter-a"]
BASES = [
    [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0],
    [0, 1, 2, 0, 1, 2, 0, 2, 2, 0, 1, 1, 0, 1, 2, 0],
    [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
]
# keys sharing prefixes: a cut of a base sequence plus a short random tail
keys = st.builds(
    lambda base, cut, tail: BASES[base][:cut] + tail,
    st.integers(0, len(BASES) - 1),
    st.integers(0, 16),
    st.lists(st.integers(0, 2), max_size=6),
)
namespaces = st.sampled_from(NAMESPACES)
Entry = tuple[Any, tuple[int, ...]]


@dataclass
class Req:
    ns: Any
    key: list[int]
    row: torch.Tensor  # int64 [>= len(key)]; [:p] the cache's slots, [p:] held
    p: int
    node: Any


class RadixMachine(RuleBasedStateMachine):
    page = 1

    @initialize()
    def setup(self) -> None:
        self.now = 0.0
        self.freed: list[int] = []
        free_fn = lambda t: self.freed.extend(t.tolist())  # noqa: E731
        self.cache = RadixCache(self.page, free_fn, clock=self.clock)
        self.free = set(range(TOTAL))
        self.ref: dict[Entry, list] = {}
        self.reqs: list[Req] = []
        self.extra_locks: list[tuple[Any, tuple[int, ...], Any]] = []

    def clock(self) -> float:
        return self.now

    # ---- reference model -----------------------------------------------------------

    def aligned(self, n: int) -> int:
        return n - n % self.page

    def ref_match(self, ns: Any, key: list[int]) -> int:
        length = 0
        for end in range(self.page, self.aligned(len(key)) + 1, self.page):
            if (ns, tuple(key[:end])) not in self.ref:
                break
            length = end
        return length

    def ends(self, start: int, stop: int) -> range:
        """Page ends in (start, stop]."""
        return range(start + self.page, stop + 1, self.page)

    def touch(self, ns: Any, key: list[int], length: int) -> None:
        for end in self.ends(0, length):
            self.ref[(ns, tuple(key[:end]))][1] = self.now

    def ref_slots(self, ns: Any, key: list[int], length: int) -> list[int]:
        return [s for end in self.ends(0, length) for s in self.ref[(ns, tuple(key[:end]))][0]]

    def locks(self) -> list[tuple[Any, tuple[int, ...]]]:
        out = [(r.ns, tuple(r.key[: r.p])) for r in self.reqs]
        return out + [(ns, pre) for ns, pre, _ in self.extra_locks]

    def locked_entries(self) -> set[Entry]:
        return {(ns, pre[:end]) for ns, pre in self.locks() for end in self.ends(0, len(pre))}

    def ref_insert(self, ns: Any, key: list[int], row: torch.Tensor) -> tuple[int, int]:
        """Expected (already cached length m, aligned length n); adds [m:n]."""
        n = self.aligned(len(key))
        m = self.ref_match(ns, key)
        self.touch(ns, key, m)
        for end in self.ends(m, n):
            self.ref[(ns, tuple(key[:end]))] = [row[end - self.page : end].tolist(), self.now]
        return m, n

    def give_back(self, slots: list[int]) -> None:
        for s in slots:
            assert s not in self.free, f"double free of slot {s}"
            self.free.add(s)

    def expect_freed(self, slots: torch.Tensor) -> None:
        assert sorted(self.freed) == sorted(slots.tolist())
        self.give_back(self.freed)
        self.freed.clear()

    def do_evict(self, k: int) -> int:
        ev_before = self.cache.evictable_size()
        locked = self.locked_entries()
        self.freed.clear()
        got = self.cache.evict(k)
        assert got == len(self.freed)
        assert got >= min(k, ev_before)
        by_slot = {s: e for e, v in self.ref.items() for s in v[0]}
        evicted = {by_slot[s] for s in self.freed}  # KeyError: freed a slot it did not own
        assert sorted(self.freed) == sorted(s for e in evicted for s in self.ref[e][0])
        assert not evicted & locked, "evicted a locked node"
        newest = max((self.ref[e][1] for e in evicted), default=None)
        for e in evicted:
            del self.ref[e]
        self.give_back(self.freed)
        self.freed.clear()
        parents = {(ns, pre[: -self.page]) for ns, pre in self.ref}
        for ns, pre in self.ref:  # only leaves were evicted: still prefix-closed
            assert len(pre) == self.page or (ns, pre[: -self.page]) in self.ref
        if newest is not None:  # LRU: survivors among unlocked leaves are not older
            for e in set(self.ref) - parents - locked:
                assert self.ref[e][1] >= newest
        return got

    def alloc(self, n: int) -> torch.Tensor | None:
        if len(self.free) < n:
            self.do_evict(n - len(self.free))
        if len(self.free) < n:
            return None
        slots = sorted(self.free)[:n]
        self.free.difference_update(slots)
        return torch.tensor(slots, dtype=torch.int64)

    # ---- rules ---------------------------------------------------------------------

    def checked_match(self, ns: Any, key: list[int]) -> Any:
        self.now += 1
        r = self.cache.match_prefix(key, ns)
        length = self.ref_match(ns, key)
        assert len(r.kv_indices) == length and r.kv_indices.dtype == torch.int64
        assert r.kv_indices.tolist() == self.ref_slots(ns, key, length)
        self.touch(ns, key, length)
        if length == 0:
            assert r.last_node.is_root
        return r

    @rule(ns=namespaces, key=keys)
    def match(self, ns: Any, key: list[int]) -> None:
        self.checked_match(ns, key)

    @rule(ns=namespaces, key=keys)
    def new_request(self, ns: Any, key: list[int]) -> None:
        r = self.checked_match(ns, key)
        self.cache.lock(r.last_node)
        req = Req(ns, list(key), r.kv_indices.clone(), len(r.kv_indices), r.last_node)
        self.reqs.append(req)  # locked before allocating: eviction must spare it
        own = self.alloc(len(key) - req.p)
        if own is None:
            self.reqs.pop()
            self.cache.release(req.row, req.p, req.node)
            assert self.freed == []
        else:
            req.row = torch.cat([req.row, own])

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def extend(self, i: int, tokens: list[int]) -> None:
        req = self.reqs[i % len(self.reqs)]
        own = self.alloc(len(tokens))
        if own is not None:
            req.key += tokens
            req.row = torch.cat([req.row, own])

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99))
    def cache_unfinished(self, i: int) -> None:
        self.now += 1
        req = self.reqs[i % len(self.reqs)]
        old_row = req.row
        m, n = self.ref_insert(req.ns, req.key, req.row)
        up = self.cache.cache_unfinished(req.key, req.row, req.p, req.node, req.ns)
        self.expect_freed(old_row[req.p : m])
        assert up.prefix_len == n and len(up.kv_indices) == len(old_row)
        assert up.kv_indices[:n].tolist() == self.ref_slots(req.ns, req.key, n)
        assert torch.equal(up.kv_indices[n:], old_row[n:])
        req.row, req.p, req.node = up.kv_indices, up.prefix_len, up.last_node

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99), drop_last=st.booleans())
    def finish(self, i: int, drop_last: bool) -> None:
        self.now += 1
        req = self.reqs.pop(i % len(self.reqs))
        key = req.key
        if drop_last and self.aligned(len(key) - 1) >= req.p:
            key = key[:-1]  # last decoded token has a slot but no KV yet
        m, n = self.ref_insert(req.ns, key, req.row)
        self.cache.cache_finished(key, req.row, req.p, req.node, req.ns)
        self.expect_freed(torch.cat([req.row[req.p : m], req.row[n:]]))

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99))
    def abort(self, i: int) -> None:
        req = self.reqs.pop(i % len(self.reqs))
        self.cache.release(req.row, req.p, req.node)
        self.expect_freed(req.row[req.p :])

    @rule(ns=namespaces, key=keys)
    def raw_insert(self, ns: Any, key: list[int]) -> None:
        row = self.alloc(len(key))
        if row is None:
            return
        self.now += 1
        m, n = self.ref_insert(ns, key, row)
        assert self.cache.insert(key, row, ns) == m
        assert self.freed == []
        self.give_back(row[:m].tolist() + row[n:].tolist())  # caller's duplicates + tail

    @rule(ns=namespaces, key=keys)
    def extra_lock(self, ns: Any, key: list[int]) -> None:
        r = self.checked_match(ns, key)
        self.cache.lock(r.last_node)
        self.extra_locks.append((ns, tuple(key[: len(r.kv_indices)]), r.last_node))

    @precondition(lambda self: self.extra_locks)
    @rule(i=st.integers(0, 99))
    def extra_unlock(self, i: int) -> None:
        _, _, node = self.extra_locks.pop(i % len(self.extra_locks))
        self.cache.unlock(node)

    @rule(ns=namespaces, key=keys)
    def unlock_unlocked_raises(self, ns: Any, key: list[int]) -> None:
        node = self.checked_match(ns, key).last_node
        if not node.is_root and node.lock_ref == 0:
            with pytest.raises(RuntimeError):
                self.cache.unlock(node)

    @rule(k=st.integers(0, TOTAL))
    def evict(self, k: int) -> None:
        self.do_evict(k)

    # ---- invariants ----------------------------------------------------------------

    @invariant()
    def allocator_accounting(self) -> None:
        held = [s for r in self.reqs for s in r.row[r.p :].tolist()]
        cached = [s for v in self.ref.values() for s in v[0]]
        c = self.cache
        assert c.evictable_size() + c.protected_size() == len(cached)
        assert c.protected_size() == self.page * len(self.locked_entries())
        assert len(self.free) + c.evictable_size() + c.protected_size() + len(held) == TOTAL
        assert len(set(held) | set(cached) | self.free) == TOTAL  # disjoint cover

    @invariant()
    def tree_equals_reference(self) -> None:
        seen: dict[Entry, list] = {}
        locks = self.locks()
        leaves = set()
        for ns, node in self.cache.iter_nodes():
            prefix: tuple[int, ...] = ()
            up = node
            while not up.is_root:
                prefix = up.key + prefix
                up = up.parent
            assert len(node.key) > 0 and len(node.key) % self.page == 0
            assert node.value.dtype == torch.int64 and len(node.value) == len(node.key)
            first = node.key[0] if self.page == 1 else node.key[: self.page]
            assert node.parent.children[first] is node
            assert node.parent.is_root or node.parent.lock_ref >= node.lock_ref
            start = len(prefix) - len(node.key)
            for end in self.ends(start, len(prefix)):
                slots = node.value[end - start - self.page : end - start].tolist()
                seen[(ns, prefix[:end])] = [slots, node.last_access_time]
            expect = sum(1 for lns, pre in locks if lns == ns and pre[: len(prefix)] == prefix)
            assert node.lock_ref == expect
            if not node.children and node.lock_ref == 0:
                leaves.add(node)
        assert seen == self.ref
        assert self.cache._leaves == leaves


class RadixMachinePage4(RadixMachine):
    page = 4


_settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixPage1 = RadixMachine.TestCase
TestRadixPage1.settings = _settings
TestRadixPage4 = RadixMachinePage4.TestCase
TestRadixPage4.settings = _settings
