"""Token log-probabilities: output tokens (+ top-k, + chosen ids) and prompt tokens.

Values are ``log_softmax`` of the model's *raw* logits -- before logit bias, penalties,
temperature and top-k/p filters -- so they describe the model, are comparable across
requests with different sampling settings, and equal a transformers forward pass of the
same tokens (within float32 rounding). SGLang's default (``return_logprob`` without
``--enable-...-processed-logprobs``) and vLLM's default ``logprobs_mode`` make the same
choice.

Prompt logprobs need the logits of every prompt position, which a cached prefix does not
have: a request asking for them from prompt position ``logprob_start_len`` matches the
prefix cache only up to ``logprob_start_len - 1`` tokens (as SGLang does), and the extend
step returns logits for its positions from there (`LogitsSelection`). Requests that do not
ask pay nothing: the step then returns one logits row per request, as before.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import msgspec
import torch

from radixlm.errors import InvalidRequestError
from radixlm.runtime.sampling.sampler import MAX_REQUEST_INT


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Logprobs of consecutive tokens of one request (sent over IPC).

    logprobs[i]: log-probability of token_ids[i] given the tokens before it (None for the
    very first prompt token, which has no context). top_logprobs[i] / top_ids[i]: the k
    most likely tokens at that position, best first (empty where logprobs[i] is None);
    None when no top-k was asked for. asked_ids: the token ids whose logprobs the request
    asked for at every position (SGLang's ``token_ids_logprob``), asked_logprobs[i] their
    logprobs at position i in that order (empty where logprobs[i] is None); both None
    when none were asked for. The top-k and asked lists may hold one position more than
    token_ids: the next-token position a request with max_new_tokens 0 computed in its
    prefill, where no token was generated (`next_position_only`).
    """

    logprobs: list[float | None]
    token_ids: list[int]
    top_logprobs: list[list[float]] | None = None
    top_ids: list[list[int]] | None = None
    asked_ids: list[int] | None = None
    asked_logprobs: list[list[float]] | None = None

    def extend(self, other: TokenLogprobs) -> None:
        """Append `other`'s positions (both with or both without top-k / asked ids)."""
        self.logprobs.extend(other.logprobs)
        self.token_ids.extend(other.token_ids)
        if self.top_logprobs is not None and other.top_logprobs is not None:
            self.top_logprobs.extend(other.top_logprobs)
            self.top_ids.extend(other.top_ids)
        if self.asked_logprobs is not None and other.asked_logprobs is not None:
            self.asked_logprobs.extend(other.asked_logprobs)


def next_position_only(lp: TokenLogprobs | None) -> TokenLogprobs | None:
    """The top-k alternatives and asked ids' logprobs of a sampled position without its
    token: what a request with max_new_tokens 0 returns (no token generated, but the
    prefill computed the next position's distribution; SGLang returns its top-k as
    ``output_top_logprobs``, which SGLang's cot_decoding example reads). None when
    neither was asked for."""
    if lp is None or (lp.top_logprobs is None and lp.asked_logprobs is None):
        return None
    return TokenLogprobs([], [], lp.top_logprobs, lp.top_ids, lp.asked_ids, lp.asked_logprobs)


def empty_logprobs(top_k: int, asked_ids: list[int] | None = None) -> TokenLogprobs:
    """No positions yet; with top-k lists when top_k > 0, asked-id lists when asked_ids
    is not None."""
    top = top_k > 0
    asked = asked_ids is not None
    return TokenLogprobs(
        [], [], [] if top else None, [] if top else None, asked_ids, [] if asked else None
    )


def token_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top_k: int, asked_ids: list[int] | None = None
) -> TokenLogprobs:
    """Logprobs of `token_ids` under each row of `logits`.

    Args:
        logits: float32 [P, vocab] raw logits; row i predicts token_ids[i].
        token_ids: int64 [P].
        top_k: also return the top_k most likely tokens of each row (0: none).
        asked_ids: also return these ids' logprobs under every row (None: none).
    """
    return _from_logp(torch.log_softmax(logits.float(), dim=-1), token_ids, top_k, asked_ids)


def _from_logp(
    logp: torch.Tensor, token_ids: torch.Tensor, top_k: int, asked_ids: list[int] | None
) -> TokenLogprobs:
    """`token_logprobs` from its rows' log_softmax (float32 [P, vocab])."""
    chosen = logp.gather(-1, token_ids[:, None].to(logp.device))[:, 0]
    out = TokenLogprobs(chosen.tolist(), token_ids.tolist())
    if top_k > 0:
        vals, ids = torch.topk(logp, min(top_k, logp.shape[-1]), dim=-1)
        out.top_logprobs, out.top_ids = vals.tolist(), ids.tolist()
    if asked_ids is not None:
        out.asked_ids = asked_ids
        out.asked_logprobs = logp[:, torch.tensor(asked_ids, dtype=torch.int64)].tolist()
    return out


def output_logprobs(
    logits: torch.Tensor, next_ids: torch.Tensor, reqs: Sequence[Any]
) -> list[TokenLogprobs | None]:
    """Per request, the logprob (+ top-k) of the token it just sampled; None for requests
    without ``return_logprob``. One log_softmax over only the rows that ask.

    Args:
        logits: float32 [B, vocab] raw logits of this step. next_ids: int64 [B].
        reqs: B requests (``return_logprob``, ``top_logprobs_num``,
            ``token_ids_logprob``).
    """
    rows = [i for i, r in enumerate(reqs) if r.return_logprob]
    out: list[TokenLogprobs | None] = [None] * len(reqs)
    if not rows:
        return out
    idx = torch.tensor(rows, dtype=torch.int64)
    top_k = max(reqs[i].top_logprobs_num for i in rows)
    logp = torch.log_softmax(logits[idx.to(logits.device)].float(), dim=-1)
    lp = _from_logp(logp, next_ids[idx], top_k, None)
    for j, i in enumerate(rows):
        k = reqs[i].top_logprobs_num
        one = TokenLogprobs([lp.logprobs[j]], [lp.token_ids[j]])
        if k > 0:
            one.top_logprobs, one.top_ids = [lp.top_logprobs[j][:k]], [lp.top_ids[j][:k]]
        asked = reqs[i].token_ids_logprob
        if asked is not None:  # this row's asked columns (each request has its own ids)
            one.asked_ids = asked
            one.asked_logprobs = [logp[j, torch.tensor(asked, dtype=torch.int64)].tolist()]
        out[i] = one
    return out


class _Span(msgspec.Struct):
    """Rows [row, row + count) of the step's logits predict prompt tokens pos+1.. of req."""

    req: Any
    row: int
    pos: int
    count: int


class LogitsSelection:
    """Which token positions of one forward step return logits.

    Built before the step from its (request, new tokens) list, where each request's new
    tokens start at its current ``kv_len``. Requests with pending prompt logprobs get a
    row per new position from ``logprob_start_len - 1`` on (up to the last prompt token);
    every request gets its last new token's row, which the sampler reads. Requests in
    `every_row` (jump-forward drafts being verified, `runtime/sched/jump.py`) get a row
    per new token.

    Attributes:
        indices: int64 [R] indices into the step's new tokens, or None when every request
            needs only its last token (the model's default).
        last_rows: row of each request's last token in the returned logits [R, vocab].
        first_rows: {request in `every_row`: the row of its first new token}.
    """

    def __init__(self, items: Sequence[tuple[Any, int]], every_row: Collection[Any] = ()):
        self.spans: list[_Span] = []
        self.last_rows: list[int] = []
        self.first_rows: dict[Any, int] = {}
        indices: list[int] = []
        offset = 0
        for req, n in items:
            start = req.kv_len
            if req.prompt_logprobs_pending():
                lo = max(start, max(req.logprob_start_len - 1, 0))
                hi = min(start + n, len(req.input_ids) - 1)
                if hi > lo:
                    self.spans.append(_Span(req, len(indices), lo, hi - lo))
                    indices.extend(range(offset + lo - start, offset + hi - start))
            if every_row and req in every_row:
                self.first_rows[req] = len(indices)
                indices.extend(range(offset, offset + n))
            elif not indices or indices[-1] != offset + n - 1:
                indices.append(offset + n - 1)
            self.last_rows.append(len(indices) - 1)
            offset += n
        chosen = self.spans or self.first_rows
        self.indices = torch.tensor(indices, dtype=torch.int64) if chosen else None
        if not chosen:
            self.last_rows = list(range(len(items)))

    def collect_prompt_logprobs(self, logits: torch.Tensor) -> None:
        """Append each span's prompt-token logprobs to its request's ``input_logprobs``.

        logits: float32 [R, vocab], the step's rows in `indices` order.
        """
        for s in self.spans:
            req = s.req
            targets = torch.tensor(req.input_ids[s.pos + 1 : s.pos + 1 + s.count])
            part = token_logprobs(
                logits[s.row : s.row + s.count],
                targets,
                req.top_logprobs_num,
                req.token_ids_logprob,
            )
            req.input_logprobs.extend(part)


def initial_input_logprobs(
    input_ids: list[int], start: int, top_k: int, asked_ids: list[int] | None = None
) -> TokenLogprobs:
    """The accumulator of a request's prompt logprobs from prompt position `start`: with
    start 0 it holds the first prompt token's entry (logprob None, no top-k or asked)."""
    acc = empty_logprobs(top_k, asked_ids)
    if start == 0:
        acc.logprobs.append(None)
        acc.token_ids.append(input_ids[0])
        if top_k > 0:
            acc.top_logprobs.append([])
            acc.top_ids.append([])
        if asked_ids is not None:
            acc.asked_logprobs.append([])
    return acc


class LogprobOptions(msgspec.Struct, frozen=True):
    """A request's logprob settings (SGLang's names, see `Req`); return_text_in_logprobs
    only matters to the client side that formats the result. token_ids_logprob: token
    ids whose logprobs every returned position also gives (None: none)."""

    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    token_ids_logprob: list[int] | None = None

    def validate(self, vocab_size: int, prompt_len: int | None = None) -> None:
        """Raise InvalidRequestError (param: the field at fault) for wrong types or
        out-of-range values; with `prompt_len` (tokens), also for prompt logprobs asked from
        past the prompt's last position (`logprob_start_len >= prompt_len` with
        return_logprob, as SGLang refuses). Both ints are bounded whatever return_logprob
        says (logprob_start_len by MAX_REQUEST_INT, top_logprobs_num by the vocabulary), so
        validated options always cross the process boundary."""

        if not isinstance(self.return_logprob, bool):
            raise InvalidRequestError(
                "return_logprob must be a bool", param="return_logprob", code="invalid_type"
            )
        for name in ("logprob_start_len", "top_logprobs_num"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidRequestError(
                    f"{name} must be an int, got {value!r}", param=name, code="invalid_type"
                )
        if not -1 <= self.logprob_start_len <= MAX_REQUEST_INT:
            raise InvalidRequestError(
                f"logprob_start_len must be in [-1, {MAX_REQUEST_INT}], "
                f"got {self.logprob_start_len}",
                param="logprob_start_len",
                code="invalid_value",
            )
        if self.return_logprob and prompt_len is not None and self.logprob_start_len >= prompt_len:
            raise InvalidRequestError(
                f"logprob_start_len {self.logprob_start_len} is past the prompt's last position "
                f"({prompt_len} tokens); use -1 for no prompt logprobs",
                param="logprob_start_len",
                code="invalid_value",
            )
        if not 0 <= self.top_logprobs_num <= vocab_size:
            raise InvalidRequestError(
                f"top_logprobs_num must be in [0, {vocab_size}], got {self.top_logprobs_num}",
                param="top_logprobs_num",
                code="invalid_value",
            )
        self._validate_asked(vocab_size)

    def _validate_asked(self, vocab_size: int) -> None:
        """token_ids_logprob: None or a list of at most vocab_size ints in [0, vocab_size)."""
        ids = self.token_ids_logprob
        if ids is None:
            return
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise InvalidRequestError(
                f"token_ids_logprob must be a list of token ids, got {ids!r}"[:200],
                param="token_ids_logprob",
                code="invalid_type",
            )
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad or len(ids) > vocab_size:
            raise InvalidRequestError(
                f"token_ids_logprob must hold at most {vocab_size} ids in [0, {vocab_size}), "
                f"got {bad[:5] or len(ids)}",
                param="token_ids_logprob",
                code="invalid_value",
            )
