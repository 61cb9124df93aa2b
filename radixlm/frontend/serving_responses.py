"""OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A request is translated into the equivalent chat completion (responses_protocol.py) and
prepared by `OpenAIServing`'s chat steps (tools, grammar, template, sampling), then run
as one request through the TokenizerManager. Its output becomes output items
(responses_output.py) or, streamed, the API's events (responses_stream.py).

With ``store`` (default true) the response and its conversation are kept in a bounded
in-memory LRU (responses_store.py, ``--responses-store-size``): GET /v1/responses/{id}
returns it and ``previous_response_id`` continues it, rendering the earlier turns before
the new input, so the earlier prompt and output are a cached prefix (reported in
``usage.input_tokens_details.cached_tokens``); DELETE drops it (OpenAI's
``{"id", "object": "response.deleted", "deleted": true}``). A stored response's prompt +
output stay pinned in the radix cache (`pin_key`, runtime/sched/sessions.py) within
--session-pin-budget until the store drops it or --session-timeout passes unused.
``cache_salt`` namespaces the prefix cache as on the chat routes. With
``--reasoning-parser`` the reasoning becomes a ``reasoning`` output item before the others
(not while a grammar holds from the first token: a forced call or a ``text.format``), as
chat's ``reasoning_content``.

Errors: an unknown ``previous_response_id`` is 404 (param previous_response_id, code
previous_response_not_found), as is GET or DELETE of an unknown or dropped id; malformed
input is 400 naming the Responses field.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixlm.errors import InvalidRequestError
from radixlm.frontend.errors import APIError, from_exception, log_failure, renamed
from radixlm.frontend.protocol import sched_options
from radixlm.frontend.reasoning import ReasoningParser, request_reasoning
from radixlm.frontend.responses_input import input_messages
from radixlm.frontend.responses_output import (
    assistant_turn,
    output_items,
    reasoning_text,
    response_body,
    status_of,
)
from radixlm.frontend.responses_protocol import ResponsesRequest, responses_param, to_chat
from radixlm.frontend.responses_store import ResponseStore, StoredResponse
from radixlm.frontend.responses_stream import ResponseEvents
from radixlm.frontend.serving_openai import (
    DEFAULT_CHAT_MAX_TOKENS,
    OpenAIServing,
    _check_not_aborted,
    _request_fields,
)
from radixlm.frontend.streaming import (
    CLIENT_CLOSED,
    ClientGone,
    SSEResponse,
    collect,
    first_chunk,
    merge,
    until_disconnect,
)
from radixlm.frontend.tool_calls import output_tool_parser
from radixlm.frontend.tool_parsers import ToolParser
from radixlm.frontend.tool_prompt import ToolSetup
from radixlm.runtime.sampling.sampler import SamplingParams


def pin_key(response_id: str) -> str:
    """The scheduler pin key of a stored response's prefix."""
    return f"response:{response_id}"


@dataclass
class _Turn:
    """One prepared request: its id (also the runtime rid), the prompt and sampling, and
    the conversation (chat messages, instructions left out) the output continues."""

    req: ResponsesRequest
    id: str
    created: int
    ids: list[int]
    params: SamplingParams
    tool_parser: ToolParser | None  # None: tools are not rendered, the text is a message
    reasoning: ReasoningParser | None  # None: no reasoning is split off
    conversation: list[dict[str, Any]]


class ResponsesServing:
    """The Responses routes over `openai`'s TokenizerManager; `store_size`: the most
    responses kept (0: none)."""

    def __init__(self, openai: OpenAIServing, store_size: int):
        self.openai = openai
        self.tm = openai.tm
        self.store = ResponseStore(store_size, lambda rid: self.tm.unpin(pin_key(rid)))

    async def create(self, request: Request) -> Response:
        """POST /v1/responses. Raises APIError (400, 404) / pydantic ValidationError (400)."""
        body = await request.body()
        turn = await asyncio.to_thread(self._turn, body)
        stored = turn.req.store is not False and self.store.capacity > 0
        pin = pin_key(turn.id) if stored else None
        salt = turn.req.cache_salt
        merged = merge(
            [
                self.tm.generate(
                    turn.ids,
                    turn.params,
                    rid=turn.id,
                    extra_key=salt,
                    pin_key=pin,
                    sched=sched_options(turn.req),
                )
            ]
        )
        try:
            if turn.req.stream:
                first = await first_chunk(request, merged)
                return SSEResponse(self._events(turn, first, merged))
            (result,) = await until_disconnect(request, collect(merged, 1))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        _check_not_aborted(result)
        status = status_of(result["finish_reason"])
        items = output_items(result["text"], turn.tool_parser, status, turn.reasoning)
        return JSONResponse(self._finish(turn, status, items, result["usage"]))

    async def get(self, response_id: str) -> dict[str, Any]:
        """GET /v1/responses/{id}: the stored response; 404 when unknown."""
        entry = self.store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return entry.body

    async def delete(self, response_id: str) -> dict[str, Any]:
        """DELETE /v1/responses/{id}: drop the stored response (a later
        ``previous_response_id`` naming it is 404); 404 when unknown."""
        if not self.store.delete(response_id):
            raise _not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    # ---- request -> prompt ------------------------------------------------------------

    def _turn(self, body: bytes) -> _Turn:
        req = ResponsesRequest.model_validate_json(body)
        req.warn_ignored(self.openai.strict_fields)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            prev = self.store.get(req.previous_response_id)
            if prev is None:
                raise APIError(
                    404,
                    f"Previous response with id '{req.previous_response_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = prev.conversation
        calls = frozenset(c["id"] for m in history for c in m.get("tool_calls") or [])
        strict = self.openai.strict_fields
        conversation = [*history, *input_messages(req.input, strict, calls)]
        try:
            ids, params, parser, reasoning = self._prepare(req, conversation)
        except APIError as e:
            raise responses_param(e) from None
        rid = f"resp_{uuid.uuid4().hex}"
        return _Turn(req, rid, int(time.time()), ids, params, parser, reasoning, conversation)

    def _prepare(
        self, req: ResponsesRequest, conversation: list[dict[str, Any]]
    ) -> tuple[list[int], SamplingParams, ToolParser | None, ReasoningParser | None]:
        """The chat completion steps of `OpenAIServing` for the equivalent chat request
        (chat field names in errors; the caller renames them): prompt ids, sampling, the
        tool-call parser of the output (`output_tool_parser`) and its reasoning parser
        (as chat's: none while a grammar holds from the first token)."""
        openai = self.openai
        chat = to_chat(req, conversation)
        openai._check_common(chat)
        tools = ToolSetup.from_request(
            chat.tools, chat.tool_choice, chat.parallel_tool_calls, strict=openai.strict_fields
        )
        parser = output_tool_parser(openai.tool_parser, tools, openai.native_tools)
        grammar = openai._chat_grammar(chat, tools, parser)
        ids = openai._chat_prompt(chat.messages, tools)
        params = openai._params(
            chat, chat.max_completion_tokens, len(ids), DEFAULT_CHAT_MAX_TOKENS, "messages"
        )
        if grammar:
            params = msgspec.structs.replace(params, **grammar)
        try:
            self.tm.validate(ids, params)
        except InvalidRequestError as e:
            raise renamed(e, _request_fields(chat, "messages")) from None
        auto_tags = tools.active and tools.forced is None and "structural_tag" in grammar
        mode = self.tm.args.reasoning_parser
        free = not grammar or auto_tags
        reasoning = request_reasoning(mode, chat, self.tm.tokenizer, ids) if free else None
        return ids, params, parser, reasoning

    # ---- output -----------------------------------------------------------------------

    def _finish(
        self, turn: _Turn, status: str, items: list[dict[str, Any]], counts: dict | None
    ) -> dict[str, Any]:
        """The final response body; stored (with the conversation) unless store is false."""
        thought = reasoning_text(items)
        spent = len(self.tm.tokenizer.encode(thought, add_special_tokens=False)) if thought else 0
        if counts is not None:
            spent = min(spent, counts["completion_tokens"])
        model = self.tm.model_name
        body = response_body(turn.id, turn.created, model, turn.req, status, items, counts, spent)
        if turn.req.store is not False:
            conversation = [*turn.conversation, assistant_turn(items)]
            self.store.put(turn.id, StoredResponse(body, conversation))
        return body

    async def _events(
        self, turn: _Turn, first: tuple[int, dict] | None, merged: AsyncIterator[tuple[int, dict]]
    ) -> AsyncIterator[bytes]:
        """The SSE bytes of a streamed response (see responses_stream.py)."""
        events = ResponseEvents(turn.tool_parser, turn.reasoning)
        opening = response_body(
            turn.id, turn.created, self.tm.model_name, turn.req, "in_progress", [], None
        )
        try:
            for data in events.opening(opening):
                yield data
            item = first
            while item is not None:
                _, chunk = item
                reason = chunk["finish_reason"]
                _check_not_aborted(chunk)
                status = status_of(reason)
                for data in events.feed(chunk["text"], reason is not None, status):
                    yield data
                if reason is not None:
                    for data in events.finish(status):
                        yield data
                    yield events.closing(self._finish(turn, status, events.items, chunk["usage"]))
                item = await anext(merged, None)
        except Exception as e:  # noqa: BLE001 - the status line is already sent
            err = from_exception(e)
            log_failure(f"stream {turn.id}", e, err)
            yield events.event("error", code=err.code, message=err.message, param=err.param)
        finally:
            await merged.aclose()


def _not_found(response_id: str) -> APIError:
    return APIError(
        404,
        f"Response with id '{response_id}' not found.",
        param="response_id",
        code="response_not_found",
    )
