"""Second KV tiers under the primary pool (``--hicache-tier``): `HostTier` (host memory,
for a CUDA pool; a plain RAM copy on the CPU), `DiskTier` (a memory-mapped file) and the
lossy 8-bit host-memory tiers `Fp8Tier` and `Int8Tier` (per-row scales; half an fp16
pool's bytes per token, a quarter of an fp32 pool's).

`make_kv_tier` builds the one the flags name, sized by ``--hicache-size`` (default: twice
the primary pool), and refuses at start a size larger than the memory or disk there is.
"""

from __future__ import annotations

import os
import shutil

from radixlm.config import ServerArgs, cache_dir
from radixlm.runtime.executor.kv_tier.base import KVTier, parse_tier_size, pool_buffers
from radixlm.runtime.executor.kv_tier.disk import DiskTier
from radixlm.runtime.executor.kv_tier.host import HostTier
from radixlm.runtime.executor.kv_tier.quant import Fp8Tier, Int8Tier
from radixlm.runtime.executor.memory import available_memory_bytes

__all__ = [
    "DiskTier",
    "Fp8Tier",
    "HostTier",
    "Int8Tier",
    "KVTier",
    "make_kv_tier",
    "parse_tier_size",
    "tier_capacity",
]

#: ``--hicache-tier`` name -> tier class.
TIERS: dict[str, type[KVTier]] = {
    "host": HostTier,
    "disk": DiskTier,
    "fp8": Fp8Tier,
    "int8": Int8Tier,
}


def tier_capacity(args: ServerArgs, pool, primary_tokens: int) -> tuple[int, int]:
    """(tokens, bytes per token as the tier stores them) of the tier the flags ask for,
    tokens rounded down to a page: ``--hicache-size`` (bytes are divided by the tier's
    bytes per token) or twice `primary_tokens`."""
    cls = TIERS[args.hicache_tier]
    bpt = sum(cls.stored_row_bytes(tuple(b.shape[1:]), b.dtype) for b in pool_buffers(pool))
    if args.hicache_size is None:
        tokens = 2 * primary_tokens
    else:
        tokens = parse_tier_size(args.hicache_size, bpt)
    return tokens // args.page_size * args.page_size, bpt


def make_kv_tier(args: ServerArgs, pool, primary_tokens: int) -> KVTier | None:
    """The tier ``--hicache-tier`` names over `pool` (None when the flag is unset).

    Raises ValueError when the tier holds less than a page, or (with the numbers) when
    its bytes exceed the available host memory (host, fp8, int8) or the free space of
    ``--hicache-dir`` (disk).
    """
    if args.hicache_tier is None:
        return None
    tokens, bpt = tier_capacity(args, pool, primary_tokens)
    need = tokens * bpt
    if args.hicache_tier != "disk":
        have = available_memory_bytes()
        if need > have:
            raise ValueError(
                f"--hicache-size asks for {tokens} tokens x {bpt} bytes = {need} bytes of host "
                f"memory, but only {have} bytes are available"
            )
        return TIERS[args.hicache_tier](pool, tokens, args.page_size)
    directory = args.hicache_dir or os.fspath(cache_dir() / "hicache")
    os.makedirs(directory, exist_ok=True)
    have = shutil.disk_usage(directory).free
    if need > have:
        raise ValueError(
            f"--hicache-size asks for {tokens} tokens x {bpt} bytes = {need} bytes on disk, "
            f"but {directory} has only {have} bytes free"
        )
    return DiskTier(pool, tokens, args.page_size, directory)
