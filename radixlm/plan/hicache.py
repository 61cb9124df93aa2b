"""Idle sessions a two-tier KV cache holds (``--hicache-tier``, docs/hicache.md).

An idle agent session keeps its history of `history` tokens cached between turns; the
cache keeps whole pages only, so it costs ``h = floor(history / page_size) * page_size``
slots in a tier. Sessions share no prefix, and each tier evicts whole sessions least
recently used first, so with P primary and T second-tier tokens:
    primary  = floor(P / h)
    tier     = floor(T / h)
    held     = primary + tier            (write_back: the tier holds what the pool evicted)
    held     = max(primary, tier)        (write_through: the tier copies every session, so
                                          the pool's sessions are already among the tier's)
P is the pool's token capacity (`radixlm.plan.capacity`), T the tier bytes divided by the
same KV bytes per token (the tiers store rows as the pool does). The agreement test runs
the engine with both tiers and counts the sessions it still holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from radixlm.plan.validate import NON_NEGATIVE_INT, POSITIVE_INT

WRITE_POLICIES = ("write_through", "write_back")


@dataclass(frozen=True)
class IdleSessions:
    """Sessions of `history` tokens held by the pool, the tier and both (see module)."""

    history: int
    cached_per_session: int
    primary_tokens: int
    tier_tokens: int
    write_policy: str
    primary_sessions: int
    tier_sessions: int
    held_sessions: int

    def to_dict(self) -> dict:
        return asdict(self)


def idle_sessions(
    primary_tokens: int,
    tier_tokens: int,
    history: int,
    page_size: int = 1,
    write_policy: str = "write_through",
) -> IdleSessions:
    """Idle sessions of `history` tokens the two tiers hold; see the module docstring.

    Raises ValueError for a history shorter than a page, a negative size or an unknown
    write policy."""
    NON_NEGATIVE_INT.check("primary_tokens", primary_tokens)
    NON_NEGATIVE_INT.check("tier_tokens", tier_tokens)
    POSITIVE_INT.check("page_size", page_size)
    if write_policy not in WRITE_POLICIES:
        raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
    h = history // page_size * page_size
    if h < 1:
        raise ValueError(f"history must hold at least one page of {page_size} tokens")
    primary, tier = primary_tokens // h, tier_tokens // h
    held = primary + tier if write_policy == "write_back" else max(primary, tier)
    return IdleSessions(history, h, primary_tokens, tier_tokens, write_policy, primary, tier, held)
