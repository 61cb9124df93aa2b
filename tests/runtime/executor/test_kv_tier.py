"""Second KV tiers on CPU pools: lossless round trips, page checks on the disk tier, size
parsing and the start-up refusal of a tier larger than the memory or disk there is."""

from __future__ import annotations

import os

import pytest
import torch

from radixlm.config import ServerArgs, parse_size
from radixlm.runtime.executor.kv_tier import DiskTier, HostTier, make_kv_tier, parse_tier_size
from radixlm.runtime.executor.memory import KVPool, LatentKVPool


def _pool(kind: str, slots: int, dtype=torch.float32):
    torch.manual_seed(0)
    if kind == "latent":
        pool = LatentKVPool(slots, 3, 8, 4, dtype)
    else:
        pool = KVPool(slots, 3, 2, 8, dtype)
    for buf in pool.k_buffer + pool.v_buffer:
        buf.copy_(torch.randn(buf.shape))
    return pool


def _tier(name: str, pool, capacity: int, page_size: int, tmp_path):
    if name == "disk":
        return DiskTier(pool, capacity, page_size, str(tmp_path))
    return HostTier(pool, capacity, page_size)


def _rows(pool, slots: torch.Tensor) -> list[torch.Tensor]:
    return [b[slots].clone() for b in pool.k_buffer + pool.v_buffer]


@pytest.mark.parametrize("name", ["host", "disk"])
@pytest.mark.parametrize(
    "kind,dtype", [("mha", torch.float32), ("mha", torch.bfloat16), ("latent", torch.bfloat16)]
)
@pytest.mark.parametrize("page_size", [1, 16])
def test_round_trip_is_exact(name, kind, dtype, page_size, tmp_path):
    pool = _pool(kind, 8 * page_size, dtype)
    tier = _tier(name, pool, 4 * page_size, page_size, tmp_path)
    src = torch.arange(page_size, 3 * page_size)  # pages 1 and 2 of the pool
    before = _rows(pool, src)
    slots = tier.alloc(len(src))
    assert slots is not None and tier.used() == len(src) == tier.total - tier.available()
    tier.write(src, slots)
    dst = torch.arange(4 * page_size, 6 * page_size)
    assert tier.read(slots, dst)
    assert all(torch.equal(a, b) for a, b in zip(before, _rows(pool, dst)))
    s = tier.stats()
    assert s["tier_tokens_written"] == s["tier_tokens_loaded"] == len(src)
    assert s["tier_bytes_loaded"] == len(src) * tier.bytes_per_token
    assert tier.bytes_per_token == pool.bytes_per_token
    assert tier.alloc(3 * page_size) is None  # two pages left of four
    tier.free(slots)
    assert tier.available() == tier.total


def _written(tmp_path, page_size=4):
    pool = _pool("mha", 8 * page_size)
    tier = DiskTier(pool, 4 * page_size, page_size, str(tmp_path))
    slots = tier.alloc(2 * page_size)
    tier.write(torch.arange(page_size, 3 * page_size), slots)
    return pool, tier, slots


def test_disk_tier_detects_a_corrupted_page(tmp_path):
    pool, tier, slots = _written(tmp_path)
    page = int(slots[-1]) // tier.page_size
    page_bytes = tier.data[0].numel()
    with open(tier.path, "r+b") as f:  # behind the mapping, as another process would
        f.seek(page * page_bytes + 5)
        f.write(b"\xff\x00\xff")
    dst = torch.arange(20, 28)
    before = _rows(pool, dst)
    assert not tier.read(slots, dst)
    assert tier.corrupt_pages == 1 and tier.tokens_loaded == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _rows(pool, dst)))  # untouched
    assert tier.read(slots[:4], dst[:4])  # the other page is intact


def test_disk_tier_detects_a_missing_file(tmp_path):
    pool, tier, slots = _written(tmp_path)
    os.unlink(tier.path)
    assert not tier.read(slots, torch.arange(20, 28))
    assert os.path.exists(tier.path)  # created afresh: later pages work again
    tier.write(torch.arange(4, 12), slots)
    assert tier.read(slots, torch.arange(20, 28))
    assert torch.equal(pool.k_buffer[0][4:12], pool.k_buffer[0][20:28])


def test_disk_tier_file_is_removed_with_the_tier(tmp_path):
    tier = DiskTier(_pool("mha", 8), 4, 1, str(tmp_path))
    path = tier.path
    assert os.path.getsize(path) == 4 * tier.bytes_per_token
    del tier
    assert not os.path.exists(path)


def test_sizes():
    assert parse_size("4G") == (4 << 30, True) and parse_size("1.5MiB") == (3 << 19, True)
    assert parse_size("200000") == (200000, False) and parse_size("512b") == (512, True)
    assert parse_tier_size("1K", 100) == 10 and parse_tier_size("64", 100) == 64
    for bad in ("", "4X", "1.5", "-3"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(ValueError, match="hicache_size|size"):
        ServerArgs(model="m", hicache_size="lots")
    with pytest.raises(ValueError, match="radix"):
        ServerArgs(model="m", hicache_tier="disk", disable_radix_cache=True)


def test_make_kv_tier(tmp_path):
    pool = _pool("mha", 65)
    assert make_kv_tier(ServerArgs(model="m"), pool, 64) is None
    args = ServerArgs(model="m", hicache_tier="disk", hicache_dir=str(tmp_path), page_size=16)
    tier = make_kv_tier(args, pool, 64)
    assert isinstance(tier, DiskTier) and tier.total == 128  # twice the pool by default
    args = ServerArgs(model="m", hicache_tier="host", hicache_size="1000")
    assert make_kv_tier(args, pool, 64).total == 1000


@pytest.mark.parametrize(
    "name,message",
    [
        ("host", r"= \d+ bytes of host memory, but only \d+ bytes are available"),
        ("disk", r"= \d+ bytes on disk, but .* has only \d+ bytes free"),
    ],
)
def test_tier_larger_than_memory_or_disk_fails_with_the_numbers(name, message, tmp_path):
    args = ServerArgs(model="m", hicache_tier=name, hicache_size="1024T", hicache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=message):
        make_kv_tier(args, _pool("mha", 9), 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("page_size", [1, 16])
def test_host_tier_under_a_cuda_pool(page_size):
    pool = KVPool(8 * page_size, 3, 2, 8, torch.bfloat16, device="cuda")
    for buf in pool.k_buffer + pool.v_buffer:
        buf.copy_(torch.randn(buf.shape, device="cuda"))
    tier = HostTier(pool, 4 * page_size, page_size)
    assert tier.data.is_pinned()
    src = torch.arange(page_size, 3 * page_size)
    before = _rows(pool, src.cuda())
    slots = tier.alloc(len(src))
    tier.write(src, slots)
    for buf in pool.k_buffer + pool.v_buffer:
        buf[page_size : 3 * page_size].zero_()  # the evicted slots are reused
    dst = torch.arange(4 * page_size, 6 * page_size)
    assert tier.read(slots, dst)
    after = _rows(pool, dst.cuda())  # on the compute stream, which waits for the load
    assert all(torch.equal(a, b) for a, b in zip(before, after))
