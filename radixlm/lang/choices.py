"""How `select` turns per-choice token logprobs into a decision (SGLang's names).

Every method is called with keyword arguments, one list entry per choice:

* ``input_token_logprobs``: the choice's tokens as ``[logprob, token_id, text]`` entries,
  each logprob conditioned on the prompt and the choice's earlier tokens (natural log);
* ``normalized_prompt_logprobs``: the mean of those logprobs, or `UNSCORED` (-inf) for
  a choice none of whose tokens has a logprob (its only token is the first of the
  sequence: an empty prompt, or a one-token choice merged with the whole prompt), so an
  unscorable choice never beats a scored one;
* ``output_token_logprobs``: unused by the built-in methods (empty lists);
* ``unconditional_token_logprobs``: the same tokens scored without the prompt (only for
  methods with ``requires_unconditional_logprobs``); the first entry's logprob is None.

`token_length_normalized` (the default) picks the highest mean logprob, so long choices
are not penalized for their length. `greedy_token_selection` follows greedy decoding: it
keeps the choices whose token at each position is the most likely one. The
`unconditional_likelihood_normalized` score subtracts how likely the choice is on its own
(the "calibration" of Holtzman et al. 2021, "Surface Form Competition", PMI_DC).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

Entry = list[Any]  # [logprob | None, token_id, text | None]


@dataclass
class ChoicesDecision:
    """The chosen string and what led to it (`meta_info` is what `get_meta_info` shows)."""

    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


#: The mean logprob of a choice with no scored token: below every scored choice.
UNSCORED = -math.inf


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _logprobs(entries: list[Entry]) -> list[float]:
    return [float(e[0]) for e in entries if e[0] is not None]


def _mean_or_unscored(values: list[float]) -> float:
    return sum(values) / len(values) if values else UNSCORED


def mean_logprob(entries: list[Entry]) -> float:
    """The mean of the entries' logprobs (those not None); `UNSCORED` when there are none."""
    return _mean_or_unscored(_logprobs(entries))


class ChoicesSamplingMethod:
    """Base of the selection methods: `scores` per choice, highest wins (first on ties)."""

    requires_unconditional_logprobs = False

    def scores(self, **kw: Any) -> list[float]:
        """One float per choice; higher is better (used for temperature sampling too)."""
        return list(kw["normalized_prompt_logprobs"])

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[Entry]],
        output_token_logprobs: list[list[Entry]],
        unconditional_token_logprobs: list[list[Entry]] | None = None,
    ) -> ChoicesDecision:
        kw = {
            "choices": choices,
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "unconditional_token_logprobs": unconditional_token_logprobs,
        }
        best = self.pick(**kw)
        meta = {k: v for k, v in kw.items() if k != "choices" and v is not None}
        return ChoicesDecision(choices[best], meta)

    def pick(self, **kw: Any) -> int:
        """Index of the chosen choice."""
        scores = self.scores(**kw)
        return max(range(len(scores)), key=lambda i: (scores[i], -i))


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The mean token logprob of each choice given the prompt."""


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Greedy decoding restricted to the choices.

    Position by position, keep the choices whose token logprob is the highest among those
    still in the race; a choice that has run out of tokens competes with its own mean.
    Ties left at the end go to the first choice. `scores` (for temperature sampling) are
    the mean logprobs.
    """

    def pick(self, **kw: Any) -> int:
        rows = [_logprobs(entries) for entries in kw["input_token_logprobs"]]
        means = [_mean_or_unscored(r) for r in rows]
        alive = list(range(len(rows)))
        for pos in range(max((len(r) for r in rows), default=0)):
            values = {i: rows[i][pos] if pos < len(rows[i]) else means[i] for i in alive}
            top = max(values.values())
            alive = [i for i in alive if values[i] == top]
            if len(alive) == 1:
                break
        return alive[0]


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Mean logprob given the prompt minus the mean logprob of the choice on its own.

    The unconditional logprobs score the choice's tokens as a prompt of their own; its
    first token has none (no context), so that mean runs over the others (0 for a
    one-token choice).
    """

    requires_unconditional_logprobs = True

    def scores(self, **kw: Any) -> list[float]:
        uncond = kw["unconditional_token_logprobs"]
        if uncond is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        return [
            cond - _mean(_logprobs(u)) for cond, u in zip(kw["normalized_prompt_logprobs"], uncond)
        ]


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()


def softmax_sample(scores: list[float], temperature: float, rand: float) -> int:
    """Index drawn with probability ∝ exp(score / temperature); `rand` uniform in [0, 1).
    All scores -inf (no choice scored): uniform."""
    top = max(scores)
    if top == -math.inf:
        weights = [1.0] * len(scores)
    else:
        weights = [math.exp((s - top) / temperature) for s in scores]
    target = rand * sum(weights)
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if target < acc:
            return i
    return len(scores) - 1
