"""Counter-based random draws: reproducible per (seed, output position), batch-independent.

A per-request `torch.Generator` is stateful: its draws depend on how often it was used
and cannot be batched. Here each row's random number is a pure function of
``(seed, output position)``: a vectorised 32-bit integer hash (MurmurHash3's ``fmix32``
finaliser, Appleby 2011) of those integers gives a 53-bit uniform u in (0, 1) per row,
and the token is drawn by inverse-CDF sampling over the filtered probabilities in token-id
order,

    token = min { i : sum_{j <= i} p_j >= u },

which picks token i with probability exactly p_i (tokens of probability 0 are never
drawn). A row's draw therefore depends only on its own probabilities, seed and position --
never on the other rows of the batch, the batch order, or how many steps other requests
ran -- and the whole batch is one cumsum + searchsorted (no per-request Python loop over
the vocabulary; one hash per row rather than per vocabulary entry, so the draw costs
about one softmax).
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_MASK63 = (1 << 63) - 1
_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: decorrelates consecutive counters


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32) and 0 <= c < 2**32, without int64
    overflow: the product is split into 16-bit halves of x (each partial < 2**48)."""
    lo = (x & 0xFFFF) * c
    hi = (((x >> 16) * c) & 0xFFFF) << 16
    return (lo + hi) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 fmix32 of int64 values in [0, 2**32); returns values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [R] keys in [0, 2**32) from int64 seeds [R] (in [0, 2**63)) and positions [R]."""
    lo, hi = seeds & _MASK32, (seeds >> 32) & _MASK32
    k = mix32((positions * _GOLDEN + 0x632BE5AB) & _MASK32)
    k = mix32(hi ^ k)
    return mix32(lo ^ k)


def row_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """float64 [R] uniforms in (0, 1) with 53 random bits, a pure function of each row's
    (seed, position).

    Args:
        seeds: int64 [R] per-row seeds in [0, 2**63).
        positions: int64 [R] index of the output token being drawn (0 for the first).
    """
    k1 = row_keys(seeds, positions)
    k2 = mix32(k1 ^ 0x5BD1E995)
    bits = (k1 << 21) | (k2 >> 11)  # 32 + 21 = 53 bits
    return (bits.to(torch.float64) + 0.5) / 2.0**53


def inverse_cdf_draw(
    probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Draw one token per row of `probs` (float [R, vocab], rows summing to ~1).

    Returns int64 [R]: the first token whose cumulative probability (float64, normalised
    to end at 1) reaches the row's uniform from `row_uniforms`.
    """
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    cdf = cdf / cdf[:, -1:]
    u = row_uniforms(seeds, positions).to(cdf.device)
    idx = torch.searchsorted(cdf, u[:, None])[:, 0]
    return idx.clamp_(max=probs.shape[-1] - 1)


def derive_seed(seed: int, index: int) -> int:
    """The seed of copy `index` of a request seeded with `seed` (n > 1): index 0 keeps the
    seed, copy i > 0 gets a hash of (seed, i) in [0, 2**63)."""
    if index == 0:
        return seed
    t = torch.tensor([seed & _MASK63], dtype=torch.int64)
    return int(row_keys(t, torch.tensor([index])).item() << 31 ^ (seed & _MASK63)) & _MASK63
