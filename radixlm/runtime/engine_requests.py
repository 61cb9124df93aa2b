"""Client-side request state of `radixlm.Engine` (runtime/engine.py): the per-request
detokenizer and accumulated result (`Tracked`), and the checks on prompt arguments."""

from __future__ import annotations

import numbers
from typing import Any

from radixlm.errors import InvalidRequestError
from radixlm.runtime.sampling.logprobs import LogprobOptions, TokenLogprobs, empty_logprobs
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.request import ReqOutput
from radixlm.runtime.server.detokenizer import RequestDetokenizer


def is_token(value: Any) -> bool:
    """An integer token id (Python or numpy int; bool excluded)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class Tracked:
    """Per-request client-side state: detokenizer and accumulated result."""

    def __init__(self, index: int, rid: str, tokenizer, params: SamplingParams, lp):
        self.index = index
        self.rid = rid
        self.detok = RequestDetokenizer(
            tokenizer,
            params.stop,
            params.no_stop_trim,
            params.skip_special_tokens,
            params.spaces_between_special_tokens,
        )
        self.output_ids: list[int] = []
        self.chunks: list[dict[str, Any]] = []
        self.final: ReqOutput | None = None
        self.logprobs: LogprobOptions = lp
        self.input_lp: TokenLogprobs | None = None
        self.output_lp = (
            empty_logprobs(lp.top_logprobs_num, lp.token_ids_logprob) if lp.return_logprob else None
        )


def per_prompt(value: Any, n: int, name: str) -> list[Any]:
    """One value per prompt: `value` repeated, or a list of exactly n values."""
    if isinstance(value, list):
        if len(value) != n:
            raise InvalidRequestError(
                f"{len(value)} values of {name} for {n} prompts", param=name, code="invalid_value"
            )
        return list(value)
    return [value] * n


def asked_per_prompt(value: Any, n: int) -> list[list[int] | None]:
    """`token_ids_logprob` per prompt: None, one list of ids for every prompt, or a list
    of n entries that are each a list of ids or None. Element types are checked later
    (`LogprobOptions.validate`)."""
    if value is None:
        return [None] * n
    if isinstance(value, list) and value and all(v is None or isinstance(v, list) for v in value):
        return per_prompt(value, n, "token_ids_logprob")
    return [value] * n
