"""Paged allocator, request-to-token pool, KV pool sizing and the latent (MLA) KV pool."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.executor.memory import (
    KVPool,
    LatentKVPool,
    OutOfSlotsError,
    PagedAllocator,
    ReqToTokenPool,
    kv_bytes_per_token,
    kv_capacity_tokens,
    latent_kv_bytes_per_token,
)


def test_page_zero_is_never_allocated():
    alloc = PagedAllocator(16, page_size=4)
    pages = alloc.alloc_pages(4)
    assert sorted(pages.tolist()) == [1, 2, 3, 4]
    with pytest.raises(OutOfSlotsError):
        alloc.alloc_pages(1)


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
def test_positions_share_pages_and_free_restores(page_size):
    alloc = PagedAllocator(64, page_size)
    slots = alloc.alloc_positions(0, 0, 5)
    for n in (1, 1, 3):  # grow one request token by token and in chunks
        start = len(slots)
        slots = torch.cat([slots, alloc.alloc_positions(int(slots[-1]), start, n)])
    assert len(set(slots.tolist())) == len(slots) == 10
    # Position p sits at offset p % page_size of its page.
    assert (slots % page_size).tolist() == [p % page_size for p in range(10)]
    assert alloc.available() == 64 - PagedAllocator.pages_needed(page_size, 0, 10) * page_size
    alloc.free(slots)
    assert alloc.available() == 64


def test_pages_come_out_ascending_and_freed_ones_are_reused_lowest_first():
    alloc = PagedAllocator(32, page_size=2)
    assert alloc.alloc_pages(3).tolist() == [1, 2, 3]
    a = alloc.alloc_positions(0, 0, 5)  # 3 new pages: 4, 5, 6
    assert a.tolist() == [8, 9, 10, 11, 12]
    alloc.free(torch.tensor([2, 3, 4, 5, 10, 11]))  # pages 1, 2 and 5
    assert alloc.alloc_pages(2).tolist() == [1, 2]
    assert alloc.alloc_pages(2).tolist() == [5, 7]


def test_kv_pool_lies_in_one_huge_page_mapping_on_the_cpu():
    import mmap

    pool = KVPool(1000, 2, 3, 64, torch.float16, padding_slots=4)
    if not hasattr(mmap, "MADV_HUGEPAGE") or pool._arena is None:
        pytest.skip("no transparent huge pages here")
    bufs = pool.k_buffer + pool.v_buffer
    row = 3 * 64 * 2
    stride = -(-1000 * row // 64) * 64
    assert bufs[0].data_ptr() % (2 << 20) == 0
    assert [b.data_ptr() - bufs[0].data_ptr() for b in bufs] == [i * stride for i in range(4)]
    assert all(b.shape == (1000, 3, 64) and b.dtype == torch.float16 for b in bufs)
    assert all(not b[:4].any() for b in bufs)  # the padding page reads as zeros
    pool.set_kv(1, torch.tensor([5, 9]), torch.ones(2, 3, 64), torch.full((2, 3, 64), 2.0))
    assert pool.k_buffer[1][[5, 9]].eq(1).all() and pool.v_buffer[1][[5, 9]].eq(2).all()


def _resident_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_kv_pool_memory_is_mapped_at_start_on_the_cpu():
    """Every page of the CPU pool is mapped when it is built (zeroed there), not by the
    step that first writes it: 64 MiB in 4 buffers, against one 2 MiB padding page each
    if only the padding were zeroed."""
    import os

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc here")
    slots = (16 << 20) // (3 * 64 * 4)
    before = _resident_bytes()
    pool = KVPool(slots, 2, 3, 64, torch.float32)
    grown = _resident_bytes() - before
    assert grown >= 0.9 * (64 << 20)
    assert all(not b.any() for b in pool.k_buffer + pool.v_buffer)


def test_pages_needed():
    assert PagedAllocator.pages_needed(4, 0, 5) == 2
    assert PagedAllocator.pages_needed(4, 5, 3) == 0
    assert PagedAllocator.pages_needed(4, 5, 4) == 1
    assert PagedAllocator.pages_needed(1, 7, 3) == 3


def test_req_to_token_rows():
    pool = ReqToTokenPool(2, 8)
    a, b = pool.alloc(), pool.alloc()
    assert {a, b} == {0, 1} and pool.available() == 0
    with pytest.raises(OutOfSlotsError):
        pool.alloc()
    pool.free(a)
    assert pool.alloc() == a


def test_kv_bytes_per_token_smollm2_fp32():
    # 30 layers x 3 KV heads x 64 dims x 2 (K and V) x 4 bytes
    assert kv_bytes_per_token(30, 3, 64, torch.float32) == 46_080
    pool = KVPool(8, 30, 3, 64, torch.float32)
    assert pool.bytes_per_token == 46_080
    assert pool.k_buffer[0].shape == (8, 3, 64)
    assert kv_capacity_tokens(46_080 * 100 + 5, 46_080, 16) == 96


def test_latent_pool_stores_one_row_whose_head_is_the_value():
    """[latent ; rope key] per slot and layer; V is the latent part of that same storage,
    so writing K writes V; a move between overlapping slot ranges keeps every row."""
    pool = LatentKVPool(16, num_layers=2, kv_lora_rank=6, rope_dim=2, dtype=torch.float32,
                        padding_slots=4)  # fmt: skip
    assert pool.k_buffer[1].shape == (16, 1, 8) and pool.v_buffer[1].shape == (16, 1, 6)
    assert pool.v_buffer[1].data_ptr() == pool.k_buffer[1].data_ptr()
    assert pool.bytes_per_token == latent_kv_bytes_per_token(2, 6, 2, torch.float32) == 64
    rows = torch.arange(4 * 8, dtype=torch.float32).view(4, 1, 8)
    loc = torch.tensor([5, 6, 7, 8])
    pool.set_kv(1, loc, rows, rows[..., :6])
    assert torch.equal(pool.v_buffer[1][loc], rows[..., :6])
    pool.copy_slots(torch.tensor([6, 7, 8]), torch.tensor([5, 6, 7]))
    assert torch.equal(pool.k_buffer[1][5:8], rows[1:])
    assert torch.equal(pool.v_buffer[1][5:8], rows[1:, :, :6])
    assert pool.k_buffer[0].abs().sum() == 0
