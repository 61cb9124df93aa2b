"""OpenAI-compatible /v1/completions and /v1/chat/completions.

A request becomes one tokenized prompt per choice and one `SamplingParams` each; the
prompts run concurrently through `TokenizerManager.generate` and their chunks are turned
into OpenAI response bodies (non-streamed) or ``chat.completion.chunk`` /
``text_completion`` server-sent events ending with ``data: [DONE]``.

Token counts are in tokens. Defaults follow OpenAI: temperature 1.0, top_p 1.0,
completions max_tokens 16, chat max_tokens up to the context (capped, see
`DEFAULT_CHAT_MAX_TOKENS`).

``n`` / ``best_of`` (copies per prompt, their seeds, usage, best_of selection): see
`frontend/fanout.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response

from radixlm.errors import InvalidRequestError
from radixlm.frontend.chat_template import ChatPrompts, normalise_messages, rendered_chars
from radixlm.frontend.errors import (
    APIError,
    from_exception,
    invalid_request,
    log_failure,
    renamed,
)
from radixlm.frontend.fanout import Fanout
from radixlm.frontend.formats import ChatFormat, CompletionFormat, OutputFormat, Usage
from radixlm.frontend.logprob_format import TokenTexts
from radixlm.frontend.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
    check_supported,
    sched_options,
)
from radixlm.frontend.reasoning import request_reasoning
from radixlm.frontend.request_compat import output_settings, resolve_tools, template_kwargs
from radixlm.frontend.streaming import (
    CLIENT_CLOSED,
    DONE,
    ClientGone,
    SSEResponse,
    collect,
    first_chunk,
    merge,
    sse,
    until_disconnect,
)
from radixlm.frontend.structured import check_grammar, request_grammar
from radixlm.frontend.tool_calls import ToolChatFormat, output_tool_parser
from radixlm.frontend.tool_parsers import ToolParser, make_tool_parser
from radixlm.frontend.tool_prompt import ToolSetup, template_knows_tools
from radixlm.runtime.sampling.logprobs import LogprobOptions
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.request import SchedOptions

logger = logging.getLogger(__name__)

DEFAULT_COMPLETION_MAX_TOKENS = 16
# The scheduler reserves KV for the whole max_new_tokens of a running request, so an
# unbounded default would let one chat request hold most of the pool.
DEFAULT_CHAT_MAX_TOKENS = 1024

# SamplingParams fields a request sets, when given, under the same name.
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "ignore_eos",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
)


@dataclass
class _Job:
    """A parsed request: one prompt, sampling setting and rid per run (runs are the
    prompts' copies, prompt-major: see `Fanout`)."""

    fmt: OutputFormat
    prompts: list[list[int]]
    params: list[SamplingParams]
    stream: bool
    include_usage: bool
    logprobs: LogprobOptions
    fanout: Fanout = field(default_factory=Fanout)
    rids: list[str] = field(default_factory=list)
    cache_salt: str | None = None
    sched: SchedOptions = SchedOptions()


class OpenAIServing:
    """Handlers of the OpenAI routes over a TokenizerManager `tm` (see runtime docs).

    special_in_content: parse special-token text in chat message content as control
    tokens (`--allow-special-tokens-in-content`; off: it is ordinary text).
    """

    def __init__(self, tm, special_in_content: bool = False):
        self.tm = tm
        self.texts = TokenTexts(tm.tokenizer)
        self.chats = ChatPrompts(tm.tokenizer, special_in_content)
        self.strict_fields = tm.args.strict_request_fields
        self.tool_parser = make_tool_parser(tm.args.tool_call_parser, tm.tokenizer)
        self.native_tools = template_knows_tools(tm.tokenizer)

    # ---- routes -----------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        """POST /v1/completions. Raises APIError / pydantic ValidationError (HTTP 400)."""
        body = await request.body()
        # Parsing, tokenizing and grammar compiling take a worker thread (the tokenizer
        # and xgrammar release the GIL), so a huge body never stalls the event loop.
        return await self._serve(request, await asyncio.to_thread(self._completion_job, body))

    async def chat(self, request: Request) -> Response:
        """POST /v1/chat/completions. Raises APIError / pydantic ValidationError (HTTP 400)."""
        body = await request.body()
        return await self._serve(request, await asyncio.to_thread(self._chat_job, body))

    # ---- request -> prompts and sampling ----------------------------------------------

    def _completion_job(self, body: bytes) -> _Job:
        req = CompletionRequest.model_validate_json(body)
        self._check_common(req)
        fanout = Fanout.of(req)
        if req.max_tokens == 0 and not req.echo:
            raise invalid_request(
                "'max_tokens' must be >= 1 unless 'echo' is true", param="max_tokens"
            )
        prompts = self._completion_prompts(req.prompt)
        echo = None
        if req.echo:
            texts = self._prompt_texts(req.prompt, prompts)
            echo = [t for t in texts for _ in range(fanout.n)]
        fmt = CompletionFormat(
            f"cmpl-{uuid.uuid4().hex}",
            int(time.time()),
            self.tm.model_name,
            texts=self.texts if req.logprobs is not None else None,
            echo=echo,
        )
        logprobs = LogprobOptions(
            return_logprob=req.logprobs is not None or fanout.selects,
            logprob_start_len=0 if req.echo and req.logprobs is not None else -1,
            top_logprobs_num=req.logprobs or 0,
        )
        params = [
            self._params(
                req, req.max_tokens, len(p), DEFAULT_COMPLETION_MAX_TOKENS, "prompt", fanout.copies
            )
            for p in prompts
        ]
        grammar = request_grammar(req, self.tm.grammars)
        if grammar:
            params = [msgspec.structs.replace(p, **grammar) for p in params]
        return self._job(fmt, prompts, params, req, "prompt", logprobs, fanout)

    def _chat_job(self, body: bytes) -> _Job:
        req = ChatCompletionRequest.model_validate_json(body)
        self._check_common(req)
        fanout = Fanout.of(req)  # chat has no best_of: copies == n
        if req.top_logprobs and not req.logprobs:
            raise invalid_request(
                "'top_logprobs' requires 'logprobs' to be true", param="top_logprobs"
            )
        offered, choice = resolve_tools(req.tools, req.tool_choice)
        tools = ToolSetup.from_request(
            offered, choice, req.parallel_tool_calls, strict=self.strict_fields
        )
        parser = output_tool_parser(self.tool_parser, tools, self.native_tools)
        grammar = self._chat_grammar(req, tools, parser)
        ids = self._chat_prompt(req.messages, tools, template_kwargs(req.chat_template_kwargs))
        requested = req.max_completion_tokens or req.max_tokens
        # A grammar that holds from the first token (a forced call, a response format)
        # leaves no room for reasoning; Hermes tags triggered under "auto" do.
        auto_tags = tools.active and tools.forced is None and "structural_tag" in grammar
        mode = self.tm.args.reasoning_parser
        free = not grammar or auto_tags
        reasoning = request_reasoning(mode, req, self.tm.tokenizer, ids) if free else None
        head = (f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), self.tm.model_name)
        shown = {
            "texts": self.texts if req.logprobs else None,
            "top_logprobs": req.top_logprobs or 0,
        }
        if parser is None and reasoning is None:
            fmt: ChatFormat = ChatFormat(*head, **shown)
        else:
            fmt = ToolChatFormat(*head, tool_parser=parser, reasoning=reasoning, **shown)
        logprobs = LogprobOptions(
            return_logprob=bool(req.logprobs), top_logprobs_num=req.top_logprobs or 0
        )
        params = self._params(
            req, requested, len(ids), DEFAULT_CHAT_MAX_TOKENS, "messages", fanout.copies
        )
        if grammar:
            params = msgspec.structs.replace(params, **grammar)
        return self._job(fmt, [ids], [params], req, "messages", logprobs, fanout)

    def _check_common(self, req: SamplingFields) -> None:
        if req.model is not None and req.model != self.tm.model_name:
            raise APIError(  # 404, as OpenAI and vLLM answer an unknown model
                404,
                f"The model '{req.model}' does not exist; this server serves "
                f"'{self.tm.model_name}'.",
                param="model",
                code="model_not_found",
            )
        check_supported(req, strict=self.strict_fields)
        if req.stream_options is not None and not req.stream:
            raise invalid_request(
                "'stream_options' is only allowed when 'stream' is true", param="stream_options"
            )

    def _prompt_texts(self, prompt: str | list, prompts: list[list[int]]) -> list[str]:
        """The text of each prompt for echo (token-id prompts are decoded)."""
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], str):
            return list(prompt)
        return [self.tm.tokenizer.decode(ids) for ids in prompts]

    def _completion_prompts(self, prompt: str | list) -> list[list[int]]:
        if isinstance(prompt, str):
            return [self._encode(prompt)]
        if not prompt:
            raise invalid_request("'prompt' must not be an empty list", param="prompt")
        if isinstance(prompt[0], int):
            return [list(prompt)]
        if isinstance(prompt[0], str):
            return [self._encode(p) for p in prompt]
        return [list(p) for p in prompt]

    def _encode(self, text: str) -> list[int]:
        """Plain prompts get the tokenizer's default special tokens (as `radixlm.Engine`
        does). A prompt that cannot fit the context is a 400 on `prompt`
        (context_length_exceeded)."""
        try:
            return self.tm.encode(text)
        except InvalidRequestError as e:
            raise renamed(e, {"prompt": "prompt"}) from None

    def chat_ids(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of `messages` as a chat request with these `tools` / `tool_choice`
        renders them (/tokenize). Raises APIError (400)."""
        offered, choice = resolve_tools(tools, tool_choice)
        setup = ToolSetup.from_request(offered, choice, None, strict=self.strict_fields)
        return self._chat_prompt(messages, setup)

    def _chat_prompt(
        self,
        messages: list[ChatMessage],
        tools: ToolSetup,
        variables: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the chat template (tools rendered, `variables` from
        chat_template_kwargs) with the assistant turn opened; 400 on `messages` when their
        text must exceed the context."""
        rendered = normalise_messages(messages)
        try:
            self.tm.check_chars(rendered_chars(rendered, tools, variables))
        except InvalidRequestError as e:
            raise renamed(e, {"prompt": "messages"}) from None
        return self.chats.ids(rendered, tools, variables)

    def _chat_grammar(
        self, req: ChatCompletionRequest, tools: ToolSetup, parser: ToolParser | None
    ) -> dict[str, str]:
        """Grammar fields from response_format, regex / ebnf or the tools (see
        ToolSetup.grammar, in `parser`'s convention); a forced tool choice excludes the
        others. With ``auto`` the grammar (Hermes tags) applies only to output parsed as
        Hermes."""
        grammar = request_grammar(req, self.tm.grammars)
        calls = tools.grammar(parser) if parser is not None else None
        if calls is None:
            return grammar
        if grammar and tools.forced is not None:
            raise invalid_request(
                "a forced 'tool_choice' cannot be combined with 'response_format', 'regex' "
                "or 'ebnf'",
                param="tool_choice",
            )
        if grammar:  # auto: the requested format wins; no call can start
            return grammar
        fields = {"structural_tag": calls}
        check_grammar(fields, self.tm.grammars, "tools")
        return fields

    def _params(
        self,
        req: SamplingFields,
        requested: int | None,
        prompt_len: int,
        default: int,
        prompt_param: str,
        copies: int = 1,
    ) -> SamplingParams:
        """SamplingParams for one prompt; 400 when the prompt fills the context (prompt +
        max_tokens beyond it is refused by `tm.validate`, in `_job`). An unset max_tokens
        defaults to what `copies` completions of the prompt leave of the context and the KV
        pool (at most `default`)."""
        ctx = self.tm.context_len
        if prompt_len >= ctx:
            raise invalid_request(
                f"This model's maximum context length is {ctx} tokens; the prompt has "
                f"{prompt_len} tokens.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if requested is None:
            ps = self.tm.args.page_size
            pool = self.tm.max_total_tokens // ps * ps
            per_copy = (pool - prompt_len) // copies
            requested = max(1, min(default, ctx - prompt_len, per_copy))
            if req.min_tokens is not None:  # an unset max_tokens leaves room for min_tokens
                requested = max(requested, min(req.min_tokens, ctx - prompt_len))
        values: dict[str, Any] = {"max_new_tokens": requested}
        for name in _SAMPLING_FIELDS:
            if getattr(req, name) is not None:
                values[name] = getattr(req, name)
        if req.min_tokens is not None:
            values["min_new_tokens"] = req.min_tokens
        if req.stop is not None:
            values["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if req.stop_token_ids is not None:
            values["stop_token_ids"] = list(req.stop_token_ids)
        values.update(output_settings(req))
        try:
            return SamplingParams.from_any(values)
        except InvalidRequestError as e:
            raise renamed(e, _request_fields(req, prompt_param)) from None

    def _job(
        self,
        fmt: OutputFormat,
        prompts,
        params,
        req: SamplingFields,
        prompt_param: str,
        logprobs: LogprobOptions,
        fanout: Fanout,
    ) -> _Job:
        for ids, p in zip(prompts, params):
            try:
                self.tm.validate(ids, p)  # nothing runs unless every prompt is valid
            except InvalidRequestError as e:
                raise renamed(e, _request_fields(req, prompt_param)) from None
            fanout.check_fits(len(ids), p.max_new_tokens, self.tm.max_total_tokens)
        args = self.tm.args
        fanout.check_count(len(prompts), args.max_running_requests + args.max_queued_requests)
        opts = req.stream_options
        job = _Job(
            fmt,
            fanout.expand(prompts),
            fanout.expand_params(params),
            bool(req.stream),
            bool(opts and opts.include_usage),
            logprobs,
            fanout,
            cache_salt=req.cache_salt,
            sched=sched_options(req),
        )
        job.rids = [f"{fmt.id}-{i}" for i in range(len(job.prompts))]
        return job

    # ---- running ----------------------------------------------------------------------

    def _streams(self, job: _Job) -> AsyncIterator[tuple[int, dict]]:
        return merge(
            [
                self.tm.generate(
                    ids,
                    p,
                    rid=r,
                    extra_key=job.cache_salt,
                    logprobs=job.logprobs,
                    sched=job.sched,
                )
                for ids, p, r in zip(job.prompts, job.params, job.rids)
            ]
        )

    async def _serve(self, request: Request, job: _Job) -> Response:
        merged = self._streams(job)
        try:
            if job.stream:
                first = await first_chunk(request, merged)
                return SSEResponse(_stream_body(job, first, merged))
            results = await until_disconnect(request, collect(merged, len(job.rids)))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        usage = Usage()
        for run, r in enumerate(results):
            _check_not_aborted(r)
            usage.add(r["usage"], count_prompt=job.fanout.counts_prompt(run))
        if job.fanout.selects:
            results = job.fanout.best(results)
        return Response(job.fmt.encode_full(results, usage), media_type="application/json")


async def _stream_body(
    job: _Job, first: tuple[int, dict] | None, merged: AsyncIterator[tuple[int, dict]]
) -> AsyncIterator[bytes]:
    """SSE bytes: opening chunks, one chunk per text delta, finish chunks, optional usage
    chunk, ``[DONE]``. An error after the 200 header is sent as an error event."""
    usage = Usage()
    try:
        for payload in job.fmt.opening(len(job.rids), job.include_usage):
            yield sse(payload)
        item = first
        while item is not None:
            index, chunk = item
            _check_not_aborted(chunk)
            for payload in job.fmt.deltas(index, chunk, job.include_usage):
                yield sse(payload)
            if chunk["finish_reason"] is not None:
                usage.add(chunk.get("usage"), count_prompt=job.fanout.counts_prompt(index))
            item = await anext(merged, None)
        if job.include_usage:
            yield sse(job.fmt.usage_chunk(usage))
    except Exception as e:  # noqa: BLE001 - the status line is already sent
        err = from_exception(e)
        log_failure(f"stream {job.fmt.id}", e, err)
        yield sse(err.body())
    finally:
        await merged.aclose()
    yield DONE


def _check_not_aborted(chunk: dict[str, Any]) -> None:
    """An aborted request is an error in OpenAI's API, which has no "abort" finish_reason:
    400 `request_aborted` when stopped through POST /abort_request, 500 when the server
    aborted it (a failed step, shutdown). A client that disconnects never gets here: its
    stream is closed before the scheduler answers."""
    if chunk["finish_reason"] != FinishReason.ABORT:
        return
    if chunk.get("abort_requested"):
        raise APIError(
            400, "the request was stopped by POST /abort_request", code="request_aborted"
        )
    raise APIError(500, "the server aborted this request; see the server log", type="server_error")


def _tokens_param(req: SamplingFields) -> str:
    """The field that set max_new_tokens (chat prefers max_completion_tokens)."""
    return "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"


def _request_fields(req: SamplingFields, prompt_param: str) -> dict[str, str]:
    """The request field of each runtime field name a runtime error's param may hold
    (see `renamed`; a name not here, e.g. "sampling_params", is no field of the request)."""
    same = (*_SAMPLING_FIELDS, "stop", "stop_token_ids", "regex", "ebnf")
    return {
        **{name: name for name in same},
        "prompt": prompt_param,
        "max_new_tokens": _tokens_param(req),
        "min_new_tokens": "min_tokens",
    }
