"""Checks that reject a request which can never run, before it is queued.

Run by the HTTP process (`TokenizerManager`) and the in-process `Engine` with the limits
the scheduler reports (`info.model_facts`).
"""

from __future__ import annotations

from radixlm.errors import InvalidRequestError
from radixlm.runtime.executor.memory import check_fits
from radixlm.runtime.sampling import SamplingParams


def check_request(
    ids: list[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    context_len: int,
    max_total_tokens: int,
    page_size: int,
    cap_to_context: bool = True,
) -> None:
    """Reject a request that can never run.

    Raises InvalidRequestError (code "invalid_value") for an empty prompt or a token id
    outside [0, vocab_size), with param the field holding it ("prompt", "stop_token_ids",
    "logit_bias"); RequestTooLargeError (an InvalidRequestError, code
    "context_length_exceeded") for a prompt of context_len tokens or more (param
    "prompt"), for prompt + max_new_tokens beyond the context unless `cap_to_context`
    (param "max_new_tokens"; the HTTP server refuses it, the in-process Engine stops at
    the context), or prompt + max_new_tokens (capped by the context) needing more KV
    slots than the whole pool holds (param "max_new_tokens"); see `check_fits`.
    """
    if not ids:
        raise InvalidRequestError("empty prompt", param="prompt", code="invalid_value")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise InvalidRequestError(
            f"token ids must be in [0, {vocab_size})", param="prompt", code="invalid_value"
        )
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise InvalidRequestError(
            f"stop_token_ids must be in [0, {vocab_size})",
            param="stop_token_ids",
            code="invalid_value",
        )
    if params.logit_bias and max(params.logit_bias) >= vocab_size:
        raise InvalidRequestError(
            f"logit_bias keys must be token ids in [0, {vocab_size})",
            param="logit_bias",
            code="invalid_value",
        )
    check_fits(
        len(ids),
        params.max_new_tokens,
        context_len=context_len,
        total_tokens=max_total_tokens,
        page_size=page_size,
        cap_to_context=cap_to_context,
    )
