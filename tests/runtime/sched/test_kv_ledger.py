"""KVLedger slot allocation: one decode step's batched allocation against per-request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixlm.radix.radix_cache import RadixCache
from radixlm.runtime.executor.memory import OutOfSlotsError, PagedAllocator, ReqToTokenPool
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.kv_ledger import KVLedger
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.retraction import NewTokenRatio

CONTEXT = 64


def make_ledger(tokens: int, page_size: int) -> KVLedger:
    allocator = PagedAllocator(tokens, page_size)
    runner = SimpleNamespace(
        allocator=allocator,
        req_to_token_pool=ReqToTokenPool(8, CONTEXT + 1),
        context_len=CONTEXT,
    )
    tree = RadixCache(page_size, free_fn=allocator.free)
    return KVLedger(runner, tree, NewTokenRatio())


def prefill(ledger: KVLedger, lengths: list[int]) -> list[Req]:
    """Requests holding rows and slots for their first `lengths` positions."""
    reqs = []
    for i, n in enumerate(lengths):
        req = Req(f"r{i}", list(range(100 * i, 100 * i + n)), SamplingParams(max_new_tokens=8))
        req.row = ledger.req_pool.alloc()
        ledger.alloc(req, 0, n)
        req.kv_len = n
        reqs.append(req)
    return reqs


# Lengths put the next position at a page start, inside a page and at a page's last slot.
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("lengths", [[5, 8, 1, 12], [3], [16, 15, 31, 32, 7]])
def test_decode_slots_equal_per_request_alloc(page_size, lengths):
    one, each = make_ledger(256, page_size), make_ledger(256, page_size)
    reqs_one, reqs_each = prefill(one, lengths), prefill(each, lengths)
    for _ in range(3):  # three decode steps
        got = one.alloc_decode(reqs_one)
        want = torch.cat([each.alloc(r, r.kv_len, 1) for r in reqs_each])
        assert got.dtype == torch.int64
        assert got.tolist() == want.tolist()
        assert torch.equal(one.table, each.table)
        assert one.allocator.available() == each.allocator.available()
        for r in reqs_one + reqs_each:
            r.kv_len += 1
    # Position p of every request sits at offset p % page_size of its page.
    for r in reqs_one:
        slots = one.table[r.row, : r.kv_len].to(torch.int64)
        assert (slots % page_size).tolist() == [p % page_size for p in range(r.kv_len)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_evicts_unlocked_cache_when_the_free_list_is_short(page_size):
    ledger = make_ledger(16 + 4 * page_size, page_size)
    (cached,) = prefill(ledger, [16])
    ledger.tree.insert(cached.input_ids, ledger.table[cached.row, :16].to(torch.int64))
    ledger.req_pool.free(cached.row)  # the cache now owns those 16 slots, unlocked
    reqs = prefill(ledger, [page_size * 2] * 2)
    assert ledger.allocator.available() == 0  # decode must evict to fit
    slots = ledger.alloc_decode(reqs)
    assert ledger.tree.evictable_size() < 16
    held = torch.cat([ledger.table[r.row, : r.kv_len + 1] for r in reqs]).tolist()
    assert len(set(held)) == len(held)  # no slot handed out twice
    assert slots.tolist() == [int(ledger.table[r.row, r.kv_len]) for r in reqs]


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_allocates_nothing_when_the_pool_cannot_supply_every_request(page_size):
    ledger = make_ledger(4 * page_size, page_size)
    reqs = prefill(ledger, [page_size] * 3)  # 3 of 4 pages held, each next position new
    table = ledger.table.clone()
    with pytest.raises(OutOfSlotsError):
        ledger.alloc_decode(reqs)
    assert ledger.allocator.available() == page_size
    assert torch.equal(ledger.table, table)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("kept", [0, 1, 3, 5])
def test_truncate_frees_the_pages_past_the_kept_tokens(page_size, kept):
    """A step allocates 6 slots past kv_len = 5 and keeps `kept` of them: truncate frees
    every page past ceil_page(kv_len + kept), none before it."""
    ledger = make_ledger(64, page_size)
    (req,) = prefill(ledger, [5])
    free = ledger.allocator.available()
    ledger.alloc(req, 5, 6)
    req.kv_len = 5 + kept
    ledger.truncate(req, 11)
    held_pages = -(-(5 + kept) // page_size) - -(-5 // page_size)
    assert ledger.allocator.available() == free - held_pages * page_size
