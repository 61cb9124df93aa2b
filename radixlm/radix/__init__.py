"""Prefix caches (RadixCache, NoCache) behind one interface, and scheduling policies."""

from __future__ import annotations

from radixlm.radix.base import CacheUpdate, FreeFn, MatchResult, PrefixCache
from radixlm.radix.no_cache import NoCache
from radixlm.radix.radix_cache import RadixCache, TreeNode

__all__ = [
    "CacheUpdate",
    "FreeFn",
    "MatchResult",
    "NoCache",
    "PrefixCache",
    "RadixCache",
    "TreeNode",
    "make_prefix_cache",
]


def make_prefix_cache(
    disable: bool, page_size: int = 1, free_fn: FreeFn | None = None
) -> PrefixCache:
    """NoCache when `disable` (``--disable-radix-cache``), else RadixCache."""
    cls = NoCache if disable else RadixCache
    return cls(page_size=page_size, free_fn=free_fn)
