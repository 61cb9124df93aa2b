"""Prefix caches (RadixCache, HiRadixCache, NoCache) behind one interface, and scheduling
policies."""

from __future__ import annotations

from radixlm.radix.base import CacheUpdate, FreeFn, MatchResult, PrefixCache
from radixlm.radix.hiradix_cache import HiRadixCache, PageSource, TierStore
from radixlm.radix.no_cache import NoCache
from radixlm.radix.radix_cache import RadixCache, TreeNode

__all__ = [
    "CacheUpdate",
    "FreeFn",
    "HiRadixCache",
    "MatchResult",
    "NoCache",
    "PrefixCache",
    "RadixCache",
    "TreeNode",
    "make_prefix_cache",
]


def make_prefix_cache(
    disable: bool,
    page_size: int = 1,
    free_fn: FreeFn | None = None,
    *,
    tier: TierStore | None = None,
    allocator: PageSource | None = None,
    write_policy: str = "write_through",
) -> PrefixCache:
    """NoCache when `disable` (``--disable-radix-cache``), else HiRadixCache over `tier`
    and the primary `allocator` when a tier is given (``--hicache-tier``), else RadixCache."""
    if disable:
        return NoCache(page_size=page_size, free_fn=free_fn)
    if tier is None:
        return RadixCache(page_size=page_size, free_fn=free_fn)
    if allocator is None:
        raise ValueError("a tiered cache needs the primary allocator")
    return HiRadixCache(
        page_size, free_fn, tier=tier, allocator=allocator, write_policy=write_policy
    )
