"""Counter-based random draws: reproducible per (seed, output position), batch-independent.

A per-request `torch.Generator` is stateful: its draws depend on how often it was used
and cannot be batched. Here every random number is a pure function of
``(seed, output position, token id)``: a vectorised 32-bit integer hash (MurmurHash3's
``fmix32`` finaliser, Appleby 2011) of those three integers gives a uniform u in (0, 1)
per vocabulary entry, and the token is drawn with the exponential race

    token = argmax_i  p_i / E_i,   E_i = -log(u_i) ~ Exp(1),

which picks token i with probability exactly p_i (the minimum of independent
Exp(rate p_i) variables E_i / p_i is attained at i with probability p_i / sum p; the same
identity underlies the Gumbel-max trick, Gumbel 1954). A row's draw therefore depends
only on its own probabilities, seed and position -- never on the other rows of the batch,
the batch order, or how many steps other requests ran -- and a whole batch is one tensor
expression (no per-request Python loop over the vocabulary).
"""

from __future__ import annotations

import functools

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


@functools.lru_cache(maxsize=8)
def _token_keys(vocab: int, device: str) -> torch.Tensor:
    """int64 [vocab]: a hash per token id, fixed for the process (cached per vocab)."""
    ids = torch.arange(vocab, dtype=torch.int64, device=device)
    return mix32((ids * _GOLDEN + 0x7F4A7C15) & _MASK32)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [R] keys in [0, 2**32) from int64 seeds [R] (in [0, 2**63)) and positions [R]."""
    lo, hi = seeds & _MASK32, (seeds >> 32) & _MASK32
    k = mix32((positions * _GOLDEN + 0x632BE5AB) & _MASK32)
    k = mix32(hi ^ k)
    return mix32(lo ^ k)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """float64 [R, vocab] uniforms in (0, 1), a pure function of (seed, position, token id).

    Args:
        seeds: int64 [R] per-row seeds in [0, 2**63).
        positions: int64 [R] index of the output token being drawn (0 for the first).
        vocab: number of token ids.
    """
    keys = row_keys(seeds, positions)
    h = mix32(keys[:, None] ^ _token_keys(vocab, str(seeds.device))[None, :])
    return (h.to(torch.float64) + 0.5) / 2.0**32


def exponential_race(
    probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Draw one token per row of `probs` (float [R, vocab], rows summing to 1).

    Returns int64 [R]: argmax_i probs[i] / E_i with E_i = -log(u_i) from `uniforms`. Tokens
    of probability 0 are never drawn.
    """
    exp = -torch.log(uniforms(seeds, positions, probs.shape[-1]))
    return torch.argmax(probs.to(torch.float64) / exp, dim=-1)


def derive_seed(seed: int, index: int) -> int:
    """The seed of copy `index` of a request seeded with `seed` (n > 1): index 0 keeps the
    seed, copy i > 0 gets a hash of (seed, i) in [0, 2**63)."""
    if index == 0:
        return seed
    t = torch.tensor([seed & _MASK63], dtype=torch.int64)
    return int(row_keys(t, torch.tensor([index])).item() << 31 ^ (seed & _MASK63)) & _MASK63
