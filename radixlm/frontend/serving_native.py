"""POST /generate: SGLang's native route (text or token ids in, text and token ids out).

Body: ``{"text" | "input_ids", "sampling_params", "stream", "rid", "return_logprob",
"logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "token_ids_logprob"}``
(see `protocol.GenerateRequest`). A single prompt answers with one result, a batch (list of
strings or of token-id lists) with a list:

    {"text": str, "output_ids": [int],
     "meta_info": {"id": rid, "finish_reason": {"type": "stop", "matched": id | str}
                   | {"type": "length", "length": n} | {"type": "abort"} | None,
                   "prompt_tokens": int, "completion_tokens": int, "cached_tokens": int,
                   with return_logprob also input_token_logprobs, output_token_logprobs,
                   input_top_logprobs, output_top_logprobs, and with token_ids_logprob
                   input_token_ids_logprobs, output_token_ids_logprobs
                   (runtime/server/meta_info.py)}}

SGLang's sampling parameters are taken (`request_compat.sglang_sampling`); with ``n`` > 1
each prompt runs n times and the answer is a list, prompt-major (as SGLang's). With
``max_new_tokens: 0`` nothing is generated, but with return_logprob and top_logprobs_num
``output_top_logprobs`` holds the next-token alternatives the prefill computed (one
position; ``output_token_logprobs`` is empty), as SGLang returns them.

Streaming sends one such object per server-sent event with the text and output_ids so
far (cumulative, as SGLang does), plus ``"index"`` for batches, then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response

from radixlm.errors import InvalidRequestError
from radixlm.frontend import streaming
from radixlm.frontend.disagg_fields import disagg_params
from radixlm.frontend.errors import from_exception, invalid_request, log_failure, renamed
from radixlm.frontend.protocol import GenerateRequest, check_supported, sched_options
from radixlm.frontend.request_compat import check_lora, sglang_sampling
from radixlm.frontend.serving_sessions import session_params
from radixlm.runtime.sampling.logprobs import LogprobOptions
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.server.meta_info import finish_reason_info, logprob_info

logger = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()

#: Longest request id a client may choose (characters); ids travel in every message.
MAX_RID_CHARS = 256


class NativeServing:
    """Handler of /generate over a TokenizerManager `tm`."""

    def __init__(self, tm):
        self.tm = tm
        self.strict_fields = tm.args.strict_request_fields

    async def generate(self, request: Request) -> Response:
        """POST /generate. Raises APIError / ValidationError / InvalidRequestError (400)."""
        body = await request.body()
        # Parsing, tokenizing and grammar compiling take a worker thread (the tokenizer
        # and xgrammar release the GIL), so a huge body never stalls the event loop.
        req, single, prompts, params, rids, lp = await asyncio.to_thread(self._prepare, body)
        runs = zip(prompts, params, rids)
        salt, session = req.cache_salt, session_params(req, len(prompts))
        disagg = disagg_params(req, len(prompts))
        sched = sched_options(req)
        merged = streaming.merge(
            [
                self.tm.generate(
                    ids,
                    p,
                    rid=rid,
                    extra_key=salt,
                    logprobs=lp,
                    session=session,
                    disagg=disagg,
                    sched=sched,
                )
                for ids, p, rid in runs
            ]
        )
        fmt = _ResultFormat(lp.return_logprob, self.tm.tokenizer, req.return_text_in_logprobs)
        try:
            if req.stream:
                first = await streaming.first_chunk(request, merged)
                lens = [len(p) for p in prompts]
                body = _stream_body(first, merged, rids, lens, single, fmt)
                return streaming.SSEResponse(body)
            done = streaming.collect(merged, len(prompts))
            results = await streaming.until_disconnect(request, done)
        except streaming.ClientGone:
            return Response(status_code=streaming.CLIENT_CLOSED)
        out = [fmt.result(r, rid, len(p)) for r, rid, p in zip(results, rids, prompts)]
        return Response(_encoder.encode(out[0] if single else out), media_type="application/json")

    def _prepare(self, body: bytes) -> tuple:
        """(request, single, prompt ids, SamplingParams, rids, LogprobOptions) of a
        /generate body, every prompt validated. Raises as `generate`."""
        req = GenerateRequest.model_validate_json(body)
        value = req.sampling_params
        pairs = [sglang_sampling(v, self.strict_fields) for v in _as_list(value)]
        check_supported(req, self.strict_fields, [k for p in pairs for k in p[2]])
        check_lora(req.lora_path)
        single, prompts = self._prompts(req)
        converted = [p[0] for p in pairs]
        params = self._params(converted if isinstance(value, list) else converted[0], prompts)
        rids = self._rids(req.rid, len(prompts))
        n = _copies([p[1] for p in pairs])
        if n > 1:  # SGLang's parallel sampling: n runs per prompt, answered as a list
            self._check_copies(prompts, params, n)
            single = False
            prompts, params = _repeat(prompts, n), _repeat(params, n)
            rids = [f"{rid}-{j}" for rid in rids for j in range(n)]
        lp = LogprobOptions(
            return_logprob=bool(req.return_logprob),
            logprob_start_len=-1 if req.logprob_start_len is None else req.logprob_start_len,
            top_logprobs_num=req.top_logprobs_num or 0,
            token_ids_logprob=req.token_ids_logprob,
        )
        fields = _request_fields("text" if req.text is not None else "input_ids")
        for ids, p in zip(prompts, params):
            try:
                self.tm.validate(ids, p, lp)
            except InvalidRequestError as e:
                raise renamed(e, fields) from None
        return req, single, prompts, params, rids, lp

    def _check_copies(self, prompts: list[list[int]], params: list, n: int) -> None:
        """400 on ``sampling_params.n`` when the copies can never be served: more
        sequences than --max-running-requests + --max-queued-requests (the queue would
        refuse them every time), or a prompt's copies whose completions cannot fit the
        KV pool together (the prompt is shared). Units: sequences, tokens."""
        args = self.tm.args
        limit = args.max_running_requests + args.max_queued_requests
        if len(prompts) * n > limit:
            raise invalid_request(
                f"the request runs {len(prompts) * n} sequences (prompts x n = "
                f"{len(prompts)} x {n}), more than the server can hold at once ({limit}: "
                "--max-running-requests + --max-queued-requests)",
                param="sampling_params.n",
            )
        for ids, p in zip(prompts, params):
            need = len(ids) + n * p.max_new_tokens
            if need > self.tm.max_total_tokens:
                raise invalid_request(
                    f"n ({n}) x max_new_tokens ({p.max_new_tokens}) + the prompt "
                    f"({len(ids)}) need {need} KV tokens, more than the server's "
                    f"{self.tm.max_total_tokens}",
                    param="sampling_params.n",
                )

    def _prompts(self, req: GenerateRequest) -> tuple[bool, list[list[int]]]:
        if (req.text is None) == (req.input_ids is None):
            raise invalid_request("pass exactly one of 'text' and 'input_ids'", param="text")
        if isinstance(req.text, str):
            return True, [self._encode(req.text)]
        if req.text is not None:
            if not req.text:
                raise invalid_request("'text' must not be an empty list", param="text")
            return False, [self._encode(t) for t in req.text]
        ids = req.input_ids
        if not ids:
            raise invalid_request("'input_ids' must not be empty", param="input_ids")
        if isinstance(ids[0], int):
            return True, [list(ids)]
        return False, [list(p) for p in ids]

    def _encode(self, text: str) -> list[int]:
        try:
            return self.tm.encode(text)
        except InvalidRequestError as e:
            raise renamed(e, {"prompt": "text"}) from None

    def _params(self, value: dict | list | None, prompts: list[list[int]]) -> list[SamplingParams]:
        """One SamplingParams per prompt; every error is a 400 on `sampling_params`.

        A params dict without max_new_tokens gets the default (128, SGLang's) capped at
        what the context leaves after its prompt, so only an explicit max_new_tokens can
        exceed the context (a 400, docs/serving.md "Limits")."""
        n = len(prompts)
        if isinstance(value, list) and len(value) != n:
            raise invalid_request(
                f"{len(value)} sampling_params for {n} prompts",
                param="sampling_params",
                code="invalid_value",
            )
        raw = value if isinstance(value, list) else [value] * n
        try:
            if isinstance(value, list):
                params = [SamplingParams.from_any(v) for v in value]
            else:
                params = [SamplingParams.from_any(value)] * n
            for p in params:
                self.tm.grammars.validate(p)  # json_schema / regex / ebnf compile (cached)
        except InvalidRequestError as e:
            raise renamed(e, {}, default="sampling_params") from None
        ctx = self.tm.context_len
        return [
            p if v and "max_new_tokens" in v else _within_context(p, ctx - len(ids))
            for p, v, ids in zip(params, raw, prompts)
        ]

    @staticmethod
    def _rids(value: str | list[str] | None, n: int) -> list[str]:
        if value is None:
            base = uuid.uuid4().hex
            return [base] if n == 1 else [f"{base}-{i}" for i in range(n)]
        rids = [value] if isinstance(value, str) else list(value)
        if (
            len(rids) != n
            or len(set(rids)) != n
            or not all(0 < len(r) <= MAX_RID_CHARS for r in rids)
        ):
            raise invalid_request(
                f"'rid' must give {n} distinct non-empty ids of at most {MAX_RID_CHARS} characters",
                param="rid",
            )
        return rids


def _request_fields(prompt_param: str) -> dict[str, str]:
    """The /generate field of each runtime field name a runtime error's param may hold
    (see `renamed`): the prompt is `prompt_param` ("text" or "input_ids"), sampling
    values are inside "sampling_params", logprob options and rid keep their names."""
    sampling = (*SamplingParams.__struct_fields__, "sampling_params")
    same = ("return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "rid")
    return {
        **dict.fromkeys(sampling, "sampling_params"),
        **{name: name for name in same},
        "prompt": prompt_param,
    }


def _within_context(params: SamplingParams, room: int) -> SamplingParams:
    """`params` with max_new_tokens (and min_new_tokens) at most `room` (>= 0), the tokens
    the context leaves after the prompt; generation would stop there anyway."""
    cap = max(room, 0)
    if params.max_new_tokens <= cap:
        return params
    return msgspec.structs.replace(
        params, max_new_tokens=cap, min_new_tokens=min(params.min_new_tokens, cap)
    )


def _as_list(value: dict | list | None) -> list:
    """The sampling_params dicts of a request (one None when absent)."""
    return value if isinstance(value, list) else [value]


def _copies(ns: list[int]) -> int:
    """The request's n; 400 unless every sampling_params dict asks for the same (SGLang)."""
    if len(set(ns)) > 1:
        raise invalid_request(
            "every sampling_params entry must ask for the same n",
            param="sampling_params",
            code="invalid_value",
        )
    return ns[0]


def _repeat(items: list, n: int) -> list:
    """Each item n times in a row (prompt-major)."""
    return [x for x in items for _ in range(n)]


class _ResultFormat:
    """Builds SGLang result objects; with logprobs their meta_info logprob lists."""

    def __init__(self, logprobs: bool, tokenizer, with_text: bool | None):
        self.logprobs = logprobs
        self.decode = (lambda tok: tokenizer.decode([tok])) if with_text else None

    def result(self, r: dict[str, Any], rid: str, prompt_len: int) -> dict[str, Any]:
        """The SGLang result object; cached_tokens is known once the request finishes."""
        usage = r["usage"] or {}
        completion = usage.get("completion_tokens", len(r["output_ids"]))
        meta = {
            "id": rid,
            "finish_reason": finish_reason_info(r["finish_reason"], r["matched_stop"], completion),
            "prompt_tokens": usage.get("prompt_tokens", prompt_len),
            "completion_tokens": completion,
            "cached_tokens": usage.get("cached_tokens"),
            **({k: usage[k] for k in ("spec_accept_length",) if k in usage}),
        }
        if self.logprobs:
            meta.update(logprob_info(r["input_logprobs"], r["output_logprobs"], self.decode))
        return {"text": r["text"], "output_ids": r["output_ids"], "meta_info": meta}


async def _stream_body(
    first: tuple[int, dict] | None,
    merged: AsyncIterator[tuple[int, dict]],
    rids: list[str],
    prompt_lens: list[int],
    single: bool,
    fmt: _ResultFormat,
) -> AsyncIterator[bytes]:
    """Cumulative result objects per chunk, then [DONE]; errors become an error event."""
    sofar = [streaming.new_result() for _ in rids]
    try:
        item = first
        while item is not None:
            index, chunk = item
            r = sofar[index]
            r["text"] += chunk["text"]
            r["output_ids"] = r["output_ids"] + chunk["output_ids"]
            streaming.add_logprobs(r, chunk)
            if chunk["finish_reason"] is not None:
                r.update(
                    finish_reason=chunk["finish_reason"],
                    matched_stop=chunk.get("matched_stop"),
                    usage=chunk.get("usage"),
                )
            body = fmt.result(r, rids[index], prompt_lens[index])
            if not single:
                body["index"] = index
            yield streaming.sse(body)
            item = await anext(merged, None)
    except Exception as e:  # noqa: BLE001 - the status line is already sent
        err = from_exception(e)
        log_failure("generate stream", e, err)
        yield streaming.sse(err.body())
    finally:
        await merged.aclose()
    yield streaming.DONE
