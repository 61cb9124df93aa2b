"""The lossy 8-bit tiers (``--hicache-tier fp8`` / ``int8``): round-trip error within the
format's bound, bytes per token, and capacity for a ``--hicache-size`` in bytes."""

from __future__ import annotations

import pytest
import torch

from radixlm.config import ServerArgs
from radixlm.runtime.executor.kv_tier import Fp8Tier, HostTier, Int8Tier, make_kv_tier
from radixlm.runtime.executor.memory import KVPool, LatentKVPool

LAYERS, HEADS, DIM = 3, 2, 16


def _pool(kind: str, slots: int, dtype) -> KVPool | LatentKVPool:
    torch.manual_seed(0)
    if kind == "latent":
        pool = LatentKVPool(slots, LAYERS, DIM - 4, 4, dtype)
    else:
        pool = KVPool(slots, LAYERS, HEADS, DIM, dtype)
    for buf in pool.k_buffer + pool.v_buffer:
        # magnitudes over several octaves, some exact zeros and one all-zero row
        x = torch.randn(buf.shape) * torch.exp2(torch.randint(-8, 6, buf.shape).float())
        x[x.abs() < 1e-3] = 0
        x[0] = 0
        buf.copy_(x)
    return pool


def _bound(cls, x: torch.Tensor) -> torch.Tensor:
    """Largest |x - load(store(x))| per value allowed by the format, plus the cast back to
    the pool dtype (at most eps(dtype) * |x| with the format's own error included)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / cls.qmax, torch.ones_like(amax))
    if cls is Fp8Tier:
        fmt = torch.maximum(xf.abs() * 2.0**-4, scale * 2.0**-10)
    else:
        fmt = scale / 2
    cast = torch.finfo(x.dtype).eps * (xf.abs() + fmt)
    return fmt * (1 + 1e-6) + cast


@pytest.mark.parametrize("cls", [Fp8Tier, Int8Tier])
@pytest.mark.parametrize(
    "kind,dtype",
    [("mha", torch.float32), ("mha", torch.float16), ("mha", torch.bfloat16),
     ("latent", torch.bfloat16)],
)  # fmt: skip
@pytest.mark.parametrize("page_size", [1, 4])
def test_round_trip_within_the_format_bound(cls, kind, dtype, page_size):
    pool = _pool(kind, 8 * page_size, dtype)
    tier = cls(pool, 4 * page_size, page_size)
    bufs = list(pool.k_buffer) if kind == "latent" else pool.k_buffer + pool.v_buffer
    src = torch.arange(0, 3 * page_size)
    before = [b[src].clone() for b in bufs]
    slots = tier.alloc(len(src))
    tier.write(src, slots)
    dst = torch.arange(4 * page_size, 7 * page_size)
    assert tier.read(slots, dst)
    worst = 0.0
    for x, b in zip(before, bufs):
        err = (b[dst].float() - x.float()).abs()
        assert bool((err <= _bound(cls, x)).all()), (err - _bound(cls, x)).max()
        worst = max(worst, float(err.max()))
        assert torch.equal(b[dst][0], torch.zeros_like(b[0]))  # the all-zero row stays 0
    assert worst > 0  # lossy: the stored values are not the pool's
    assert not tier.lossless
    assert tier.stats()["tier_bytes_loaded"] == len(src) * tier.bytes_per_token


@pytest.mark.parametrize("dtype,ratio", [(torch.float32, 4), (torch.float16, 2)])
def test_bytes_per_token_and_capacity(dtype, ratio, tmp_path):
    pool = KVPool(65, LAYERS, HEADS, 64, dtype)
    per_row = HEADS * 64 + HEADS * 4  # one byte per value, a float32 scale per head
    for name in ("fp8", "int8"):
        args = ServerArgs(model="m", hicache_tier=name, hicache_size="1M", page_size=16)
        tier = make_kv_tier(args, pool, 64)
        assert type(tier) is {"fp8": Fp8Tier, "int8": Int8Tier}[name]
        assert tier.bytes_per_token == 2 * LAYERS * per_row
        assert tier.bytes_per_token * ratio == pytest.approx(pool.bytes_per_token, rel=0.07)
        assert tier.total == (1 << 20) // tier.bytes_per_token // 16 * 16
        assert tier.data.numel() == tier.total * tier.bytes_per_token
    host = make_kv_tier(ServerArgs(model="m", hicache_tier="host", hicache_size="1M"), pool, 64)
    assert isinstance(host, HostTier) and host.bytes_per_token == pool.bytes_per_token
    assert tier.total >= ratio * 0.9 * host.total
    args = ServerArgs(model="m", hicache_tier="fp8", hicache_size="1024T")
    with pytest.raises(ValueError, match=r"bytes of host memory, but only \d+ bytes"):
        make_kv_tier(args, pool, 64)
