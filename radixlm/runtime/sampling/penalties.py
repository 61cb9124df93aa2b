"""Logit processors applied before temperature: logit bias, penalties, min_new_tokens.

All are batched: one step builds index tensors of the (row, token) pairs a processor
touches -- token counts come from one `torch.unique` over row * vocab + token -- and
applies it with a few gather / `index_put_` ops, so the cost grows with the tokens seen,
not with batch x vocabulary; rows that use no processor cost nothing.

* logit_bias (OpenAI): ``logit[t] += bias[t]``.
* frequency / presence penalty (OpenAI, "Frequency and presence penalties" in the API
  guide): ``logit[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty``
  where count[t] counts token t in the *generated* tokens only; negative values favour
  repetition.
* repetition_penalty (CTRL, Keskar et al. 2019, as in transformers'
  ``RepetitionPenaltyLogitsProcessor``): for every token in prompt + output,
  ``logit / p`` when the logit is positive, ``logit * p`` otherwise.
* min_new_tokens: EOS (unless ignore_eos) and stop_token_ids get -inf until the request
  has generated min_new_tokens tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def uses_processors(params) -> bool:
    """Whether a request's SamplingParams change its logits before temperature."""
    return bool(
        params.logit_bias
        or params.frequency_penalty
        or params.presence_penalty
        or params.repetition_penalty != 1.0
        or params.min_new_tokens
    )


def apply_processors(
    logits: torch.Tensor, reqs: Sequence[Any], eos_token_ids: Sequence[int]
) -> torch.Tensor:
    """Apply every request's logit processors.

    Args:
        logits: float32 [B, vocab]; row b belongs to reqs[b] (objects with ``params``,
            ``input_ids`` and ``output_ids``). Not modified.
        eos_token_ids: ids masked by min_new_tokens unless the request ignores EOS.
    Returns:
        float32 [B, vocab]: `logits` itself when no request uses a processor, else a copy.
    """
    rows = [b for b, r in enumerate(reqs) if uses_processors(r.params)]
    if not rows:
        return logits
    logits = logits.clone()
    sub = [reqs[b] for b in rows]
    idx = torch.tensor(rows, dtype=torch.int64, device=logits.device)
    x = logits[idx]
    x = _logit_bias(x, sub)
    x = _repetition(x, sub)
    x = _frequency_presence(x, sub)
    x = _min_new_tokens(x, sub, eos_token_ids)
    logits[idx] = x
    return logits


def _unique_pairs(
    rows: list[int], ids: list[list[int]], vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct (row, token id) pairs for the tokens ids[j] of row rows[j], with counts:
    three int64 tensors [P]. Work is proportional to the tokens, not to the vocabulary."""
    r = torch.tensor([row for row, seq in zip(rows, ids) for _ in seq], dtype=torch.int64)
    t = torch.tensor([tok for seq in ids for tok in seq], dtype=torch.int64)
    keys, counts = torch.unique(r * vocab + t, return_counts=True)
    return keys // vocab, keys % vocab, counts


def _logit_bias(x: torch.Tensor, reqs: Sequence[Any]) -> torch.Tensor:
    rows, toks, vals = [], [], []
    for j, r in enumerate(reqs):
        for tok, bias in (r.params.logit_bias or {}).items():
            rows.append(j)
            toks.append(int(tok))
            vals.append(float(bias))
    if rows:
        index = (torch.tensor(rows), torch.tensor(toks))
        x.index_put_(index, torch.tensor(vals, dtype=x.dtype), accumulate=True)
    return x


def _repetition(x: torch.Tensor, reqs: Sequence[Any]) -> torch.Tensor:
    js = [j for j, r in enumerate(reqs) if r.params.repetition_penalty != 1.0]
    if not js:
        return x
    seqs = [reqs[j].input_ids + reqs[j].output_ids for j in js]
    rows, toks, _ = _unique_pairs(js, seqs, x.shape[-1])
    penalty = torch.tensor([r.params.repetition_penalty for r in reqs], dtype=x.dtype)[rows]
    rows, toks, penalty = rows.to(x.device), toks.to(x.device), penalty.to(x.device)
    vals = x[rows, toks]
    x[rows, toks] = torch.where(vals > 0, vals / penalty, vals * penalty)
    return x


def _frequency_presence(x: torch.Tensor, reqs: Sequence[Any]) -> torch.Tensor:
    js = [
        j
        for j, r in enumerate(reqs)
        if (r.params.frequency_penalty or r.params.presence_penalty) and r.output_ids
    ]
    if not js:
        return x
    rows, toks, counts = _unique_pairs(js, [reqs[j].output_ids for j in js], x.shape[-1])
    freq = torch.tensor([r.params.frequency_penalty for r in reqs], dtype=x.dtype)[rows]
    pres = torch.tensor([r.params.presence_penalty for r in reqs], dtype=x.dtype)[rows]
    delta = counts.to(x.dtype) * freq + pres
    x.index_put_((rows.to(x.device), toks.to(x.device)), -delta.to(x.device), accumulate=True)
    return x


def _min_new_tokens(
    x: torch.Tensor, reqs: Sequence[Any], eos_token_ids: Sequence[int]
) -> torch.Tensor:
    rows, toks = [], []
    for j, r in enumerate(reqs):
        p = r.params
        if len(r.output_ids) >= p.min_new_tokens:
            continue
        banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
        rows.extend([j] * len(banned))
        toks.extend(sorted(banned))
    if rows:
        x[torch.tensor(rows), torch.tensor(toks)] = float("-inf")
    return x
