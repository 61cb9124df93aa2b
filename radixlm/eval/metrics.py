"""Scores of one configuration, and of a candidate against the baseline, on the same prompts.

Definitions (all pure functions of the engines' outputs):

- Greedy agreement of two token sequences of length L: the fraction of positions i < L
  where both hold the same token; first divergence: the first position where they differ
  (L when none). After the first divergence the two continue from different prefixes, so
  the first divergence is the sharper measure; agreement also counts re-convergence.
- Next-token KL divergence KL(baseline || candidate) at a teacher-forced position, from
  the engines' top-k logprobs (k = `--top-k`): both distributions are coarsened to the
  baseline's top-k tokens plus one bucket holding the rest of the mass, and the KL of those
  (k + 1)-outcome distributions is taken. By the data-processing inequality this is at
  most the full-vocabulary KL, and equals it when the tail is negligible. A baseline top-k
  token missing from the candidate's top-k gets the candidate's k-th logprob (an upper
  bound on its true value); the candidate's bucket keeps at least `TAIL_FLOOR`.
- Top-1 agreement: the fraction of positions where both top-1 tokens are equal.
- Perplexity: exp of the mean negative logprob of the text's tokens after the first.
- Exact match: `extract_answer` of the completion equals the expected answer.
- JSON validity: `json_valid` (the first JSON value in the text, checked against the
  schema with the `jsonschema` package).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence

import jsonschema

#: Smallest tail mass given to the candidate's bucket (its top-k can sum to ~1 in float32).
TAIL_FLOOR = 1e-10


def greedy_agreement(base: Sequence[int], cand: Sequence[int]) -> tuple[float, int]:
    """(agreement fraction, first divergence position) over the baseline's length L; a
    shorter candidate disagrees at every missing position. L = 0 gives (1.0, 0)."""
    n = len(base)
    if n == 0:
        return 1.0, 0
    same = [i < len(cand) and cand[i] == base[i] for i in range(n)]
    first = next((i for i, s in enumerate(same) if not s), n)
    return sum(same) / n, first


def topk_kl(base: Sequence[tuple[float, int]], cand: Sequence[tuple[float, int]]) -> float:
    """KL(baseline || candidate), nats, of one position's top-k lists of (logprob,
    token id), best first, coarsened as in the module doc. Raises ValueError on an empty
    list."""
    if not base or not cand:
        raise ValueError("top-k KL needs non-empty top-k lists")
    cand_lp = {tok: lp for lp, tok in cand}
    floor = min(lp for lp, _ in cand)
    kl, p_top, q_top = 0.0, 0.0, 0.0
    for lp, tok in base:
        p, lq = math.exp(lp), cand_lp.get(tok, floor)
        kl += p * (lp - lq)
        p_top += p
        q_top += math.exp(lq)
    p_rest = max(0.0, 1.0 - p_top)
    q_rest = max(TAIL_FLOOR, 1.0 - q_top)
    if p_rest > 0.0:
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(0.0, kl)


def perplexity(logprobs: Sequence[float]) -> float:
    """exp(-mean logprob); NaN for no tokens."""
    return math.exp(-statistics.fmean(logprobs)) if logprobs else math.nan


_INT = re.compile(r"-?\d+")


def extract_answer(text: str, numeric: bool) -> str:
    """The answer in a completion: its first line's first integer when `numeric`, else its
    stripped first line ('' when none)."""
    first = text.strip().split("\n", 1)[0].strip() if text.strip() else ""
    if not numeric:
        return first
    m = _INT.search(first)
    return m.group(0) if m else ""


def exact_match(text: str, answer: str) -> bool:
    """Whether the completion `text` answers `answer` (numeric answers compare as integers
    read from the completion's first line)."""
    numeric = _INT.fullmatch(answer.strip()) is not None
    return extract_answer(text, numeric) == answer.strip()


def first_json_value(text: str) -> object:
    """The first JSON value in `text` starting at its first '{' or '['. Raises ValueError
    when there is none that parses."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON object or array")
    value, _ = json.JSONDecoder().raw_decode(text, min(starts))
    return value


def json_valid(text: str, schema: dict) -> bool:
    """Whether `text` holds a JSON value (`first_json_value`) valid under `schema`."""
    try:
        jsonschema.validate(first_json_value(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for no values."""
    return statistics.fmean(values) if values else math.nan


def median(values: Sequence[float]) -> float:
    """Median; NaN for no values."""
    return float(statistics.median(values)) if values else math.nan
