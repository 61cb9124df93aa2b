"""SGLang's ``meta_info`` result fields, shared by `Engine.generate` and ``POST /generate``.

Logprob fields (with ``return_logprob``), one entry per token, text None unless
``return_text_in_logprobs``:

    input_token_logprobs:  [[logprob | None, token_id, text], ...]   prompt tokens from
                           logprob_start_len (the very first prompt token has None)
    output_token_logprobs: [[logprob, token_id, text], ...]
    input_top_logprobs / output_top_logprobs: per position a list of
                           [logprob, token_id, text] (best first), None for the very
                           first prompt token; with max_new_tokens 0 and
                           top_logprobs_num, output_top_logprobs holds the one next-token
                           position of the prefill while output_token_logprobs is empty
    input_token_ids_logprobs / output_token_ids_logprobs: only with token_ids_logprob;
                           per position a list of [logprob, token_id, text], one per
                           asked id in the asked order (None for the very first prompt
                           token); with max_new_tokens 0 the output list holds the
                           prefill's next-token position, like output_top_logprobs
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.runtime.sampling.logprobs import TokenLogprobs
from radixlm.runtime.sched.finish import FinishReason

Decode = Callable[[int], str] | None


def finish_reason_info(
    reason: FinishReason | None, matched_stop: Any, completion_tokens: int | None
) -> dict[str, Any] | None:
    """SGLang's finish_reason object: {"type": "stop", "matched": id | str},
    {"type": "length", "length": n}, {"type": "abort"}, or None while running."""
    if reason == FinishReason.STOP:
        return {"type": FinishReason.STOP, "matched": matched_stop}
    if reason == FinishReason.LENGTH:
        return {"type": FinishReason.LENGTH, "length": completion_tokens}
    return None if reason is None else {"type": reason}


def _entries(lp: TokenLogprobs | None, decode: Decode) -> list[list[Any]]:
    if lp is None:
        return []
    return [[v, t, decode(t) if decode else None] for v, t in zip(lp.logprobs, lp.token_ids)]


def _tops(lp: TokenLogprobs | None, decode: Decode) -> list[list[list[Any]] | None]:
    """Top-k entries per position; a position past token_ids (max_new_tokens 0, see
    `TokenLogprobs`) has its alternatives too."""
    if lp is None:
        return []
    if lp.top_logprobs is None:
        return [None if v is None else [] for v in lp.logprobs]
    values = lp.logprobs + [0.0] * (len(lp.top_logprobs) - len(lp.logprobs))
    return [
        None if v is None else [[x, t, decode(t) if decode else None] for x, t in zip(vals, ids)]
        for v, vals, ids in zip(values, lp.top_logprobs, lp.top_ids)
    ]


def _asked(lp: TokenLogprobs | None, decode: Decode) -> list[list[list[Any]] | None]:
    """The asked ids' entries per position (None where the position has no logprob)."""
    if lp is None or lp.asked_logprobs is None:
        return []
    values = lp.logprobs + [0.0] * (len(lp.asked_logprobs) - len(lp.logprobs))
    texts = [decode(t) if decode else None for t in lp.asked_ids]
    return [
        None if v is None else [[x, t, s] for x, t, s in zip(vals, lp.asked_ids, texts)]
        for v, vals in zip(values, lp.asked_logprobs)
    ]


def logprob_info(
    input_lp: TokenLogprobs | None, output_lp: TokenLogprobs | None, decode: Decode = None
) -> dict[str, list]:
    """The logprob lists of meta_info (see module doc): always the four token / top
    lists, the two asked-id lists when either side holds asked ids; `decode` maps a
    token id to its text (return_text_in_logprobs), None leaves texts None."""
    info = {
        "input_token_logprobs": _entries(input_lp, decode),
        "output_token_logprobs": _entries(output_lp, decode),
        "input_top_logprobs": _tops(input_lp, decode),
        "output_top_logprobs": _tops(output_lp, decode),
    }
    if any(lp is not None and lp.asked_ids is not None for lp in (input_lp, output_lp)):
        info["input_token_ids_logprobs"] = _asked(input_lp, decode)
        info["output_token_ids_logprobs"] = _asked(output_lp, decode)
    return info
