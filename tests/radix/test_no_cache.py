"""Unit tests for NoCache: same caller code, nothing cached."""

from __future__ import annotations

import pytest
import torch

from radixlm.radix import NoCache, RadixCache, make_prefix_cache


def test_no_cache_never_matches_and_frees_on_insert() -> None:
    freed: list[int] = []
    c = make_prefix_cache(True, 4, lambda t: freed.extend(t.tolist()))
    assert isinstance(c, NoCache)
    key = list(range(10))
    r = c.match_prefix(key)
    assert r.kv_indices.dtype == torch.int64 and r.kv_indices.numel() == 0
    c.lock(r.last_node)
    c.unlock(r.last_node)
    # insert: returns 0 and takes (and frees) kv[:n], n = 8 with page 4
    assert c.insert(key, torch.arange(10)) == 0
    assert freed == list(range(8))
    assert c.match_prefix(key).kv_indices.numel() == 0
    assert c.evict(100) == 0 and c.total_size() == 0
    with pytest.raises(ValueError):
        c.insert(key, torch.arange(3))
    with pytest.raises(RuntimeError):
        c.unlock(object())
    c.reset()


@pytest.mark.parametrize("disable", [True, False])
def test_same_caller_code_frees_everything(disable: bool) -> None:
    """The scheduler's flow leaves free + cached == total for both implementations."""
    total = 64
    free = set(range(total))

    def free_fn(t: torch.Tensor) -> None:
        for s in t.tolist():
            assert s not in free
            free.add(s)

    c = make_prefix_cache(disable, 1, free_fn)

    def alloc(n: int) -> torch.Tensor:
        return torch.tensor([free.pop() for _ in range(n)], dtype=torch.int64)

    for prompt in ([1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2]):
        r = c.match_prefix(prompt)
        c.lock(r.last_node)
        p = len(r.kv_indices)
        row = torch.cat([r.kv_indices, alloc(len(prompt) - p)])
        up = c.cache_unfinished(prompt, row, p, r.last_node)
        row = torch.cat([up.kv_indices, alloc(2)])  # two decode steps
        c.cache_finished(prompt + [9], row, up.prefix_len, up.last_node)
        assert len(free) + c.total_size() == total
        assert c.protected_size() == 0
    if disable:
        assert len(free) == total
    else:
        assert isinstance(c, RadixCache) and c.total_size() > 0
        c.evict(total)
        assert len(free) == total
