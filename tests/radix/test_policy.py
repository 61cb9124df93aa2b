"""Schedule policies and the in-batch prefix guard on a RadixCache (no model)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from radixlm.radix import NoCache, RadixCache
from radixlm.radix.policy import POLICIES, InBatchPrefixGuard, make_policy


@dataclass
class Item:
    name: str
    all_ids: list[int]
    max_new: int = 8
    extra_key: object = None
    output_ids: list[int] = field(default_factory=list)

    def remaining_new_tokens(self) -> int:
        return self.max_new


def _tree(*seqs: list[int], page_size: int = 1) -> RadixCache:
    tree = RadixCache(page_size=page_size)
    for s in seqs:
        tree.insert(s, torch.arange(len(s), dtype=torch.int64))
    return tree


A = list(range(100, 140))  # a cached 40-token "system prompt"
B = list(range(200, 210))  # a cached 10-token one


def _names(items) -> list[str]:
    return [i.name for i in items]


def test_registry_has_every_flag_value():
    assert set(POLICIES) == {"lpm", "dfs-weight", "fcfs", "lof", "random"}
    with pytest.raises(ValueError, match="unknown schedule policy"):
        make_policy("sjf", _tree())


def test_lpm_orders_by_cached_prefix_then_arrival():
    tree = _tree(A, B)
    q = [
        Item("miss", [1, 2, 3]),
        Item("b", B + [7, 8]),
        Item("a1", A + [5]),
        Item("a2", A[:20] + [9, 9]),
        Item("b2", B + [1]),
    ]
    assert _names(make_policy("lpm", tree).order(q)) == ["a1", "a2", "b", "b2", "miss"]


def test_lpm_never_counts_the_last_token():
    tree = _tree(A)
    q = [Item("whole", list(A)), Item("longer", A + [1])]
    # "whole" can reuse only 39 tokens: its last token must run for logits.
    assert _names(make_policy("lpm", tree).order(q)) == ["longer", "whole"]


def test_dfs_weight_groups_by_heaviest_subtree():
    tree = _tree(A, B)
    q = [
        Item("miss", [1, 2]),
        Item("b1", B + [1]),
        Item("a1", A + [1]),
        Item("b2", B + [2]),
        Item("b3", B + [3]),
        Item("a2", A + [2]),
    ]
    order = _names(make_policy("dfs-weight", tree).order(q))
    assert order == ["b1", "b2", "b3", "a1", "a2", "miss"]


def test_namespaces_do_not_match_each_other():
    tree = RadixCache()
    tree.insert(A, torch.arange(40), extra_key="x")
    q = [Item("y", A + [1], extra_key="y"), Item("x", A + [1], extra_key="x")]
    assert _names(make_policy("lpm", tree).order(q)) == ["x", "y"]


def test_fcfs_lof_random():
    tree = _tree()
    q = [Item("s", [1], 2), Item("l", [2], 50), Item("m", [3], 10), Item("l2", [4], 50)]
    assert _names(make_policy("fcfs", tree).order(q)) == ["s", "l", "m", "l2"]
    assert _names(make_policy("lof", tree).order(q)) == ["l", "l2", "m", "s"]
    r1 = _names(make_policy("random", tree, seed=3).order(q))
    assert sorted(r1) == sorted(_names(q)) and r1 == _names(
        make_policy("random", tree, seed=3).order(q)
    )


def test_cache_aware_policies_fall_back_to_fcfs():
    tree = _tree(A)
    q = [Item("miss", [1, 2]), Item("hit", A + [1])]
    assert _names(make_policy("lpm", tree, fallback_queue_len=1).order(q)) == ["miss", "hit"]
    assert _names(make_policy("dfs-weight", tree, fallback_queue_len=1).order(q)) == [
        "miss",
        "hit",
    ]
    assert _names(make_policy("lpm", NoCache()).order(q)) == ["miss", "hit"]


def test_in_batch_guard():
    guard = InBatchPrefixGuard(page_size=4, threshold=32)
    guard.add(A + [1, 2], None)
    assert guard.conflicts(A + [3], 0, None)  # shares 40 uncached tokens
    assert not guard.conflicts(A + [3], 16, None)  # only 24 beyond its cached 16
    assert not guard.conflicts(A + [3], 0, "salt")  # other namespace
    assert not guard.conflicts(A[:30] + [3], 0, None)  # 30 < threshold
    guard = InBatchPrefixGuard(page_size=16, threshold=32)
    guard.add(A, None)
    assert guard.conflicts(A[:33] + [5], 0, None)  # 33 shared -> 32 page-aligned
    assert not guard.conflicts(A[:31] + [5], 0, None)  # 31 shared -> 16 page-aligned
