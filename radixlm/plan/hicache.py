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
tier's bytes per token (`tier_bytes_per_token`): the pool's for the lossless tiers (host,
disk), which store rows as the pool does; for the 8-bit tiers (fp8, int8) one byte per
cached value plus one float32 scale per row of one head (a K or V head, or an MLA latent
row), as radixlm/runtime/executor/kv_tier/quant.py stores them. The agreement test runs
the engine with both tiers and counts the sessions it still holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from radixlm.plan.kv import kv_bytes_per_token_per_gpu, kv_heads_per_gpu
from radixlm.plan.models import ModelSpec
from radixlm.plan.validate import NON_NEGATIVE_INT, POSITIVE_INT

WRITE_POLICIES = ("write_through", "write_back")
#: Second-tier storage formats: "raw" stores the pool's rows as they are (host, disk).
TIER_FORMATS = ("raw", "fp8", "int8")
_SCALE_BYTES = 4  # one float32 scale per stored head row in the 8-bit tiers


def tier_bytes_per_token(
    model: ModelSpec, kv_dtype: str = "bf16", tp: int = 1, tier_format: str = "raw"
) -> float:
    """Second-tier bytes one token costs on one GPU (module docstring).

    Raises ValueError for an unknown `tier_format`."""
    if tier_format not in TIER_FORMATS:
        raise ValueError(f"tier_format must be one of {TIER_FORMATS}, got {tier_format!r}")
    if tier_format == "raw":
        return kv_bytes_per_token_per_gpu(model, kv_dtype, tp)
    if model.attention == "mla":
        rows, width = 1, model.kv_lora_rank + model.qk_rope_head_dim
    else:
        rows, width = 2 * kv_heads_per_gpu(model, tp), model.head_dim
    return model.num_layers * rows * (width + _SCALE_BYTES)


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
