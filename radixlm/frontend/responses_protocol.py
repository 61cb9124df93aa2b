"""Request types of the OpenAI Responses API (POST /v1/responses) and their translation
into a chat completion request.

Source: the OpenAI API reference, "Create a model response". A Responses request is
served as the chat completion it is equivalent to (`to_chat`), so it shares the chat
template rendering, the tool prompt and grammar (tool_prompt.py), structured output
(structured.py) and sampling of /v1/chat/completions; a string ``input`` gives exactly
the tokens of a chat completion with that one user message.

Translation:
* ``instructions`` -> a leading system message (not kept across ``previous_response_id``,
  as OpenAI documents).
* ``input``: a string -> one user message; items -> chat messages
  (`responses_input.input_messages`).
* ``tools`` (flat ``{"type": "function", "name", "description", "parameters",
  "strict"}``) -> chat tools; ``tool_choice`` ``{"type": "function", "name"}`` -> the chat
  named choice, ``allowed_tools`` -> its mode over the listed tools only; ``text.format``
  -> ``response_format``; ``max_output_tokens`` ->
  ``max_completion_tokens``.

Fields clients send by default that do not change radixlm's output (`IGNORED`, and
``text.verbosity``) are accepted and ignored with one warning per request. Unknown
fields, top level or inside ``input`` items, their content parts and ``tools``, are
ignored with a warning, or (``--strict-request-fields``) a 400 ``unknown_parameter``
naming the first by its Responses path (``input.0.foo``, ``tools.0.foo``). Errors are
400s naming the Responses field (``input.2.call_id``, ``text.format.schema``, ...).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from radixlm.frontend.errors import APIError, invalid_request
from radixlm.frontend.protocol import ChatCompletionRequest, ChatMessage, unknown_fields

logger = logging.getLogger(__name__)

_MAX_TOKENS_LIMIT = 2**31 - 1

#: Accepted and ignored (one warning per request naming those set).
IGNORED: tuple[str, ...] = (
    "reasoning",
    "truncation",
    "include",
    "metadata",
    "user",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "service_tier",
    "background",
    "max_tool_calls",
    "top_logprobs",
    "stream_options",
    "prompt",
    "conversation",
)

# OpenAI's bounds on ``metadata``: pairs, key characters, value characters.
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


class _Strict(BaseModel):
    """Strictly typed; unknown fields are kept in `model_extra` (see `warn_ignored`)."""

    model_config = ConfigDict(extra="allow", strict=True)


class TextConfig(_Strict):
    """``text``: ``format`` is ``{"type": "text"}``, ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "name", "schema", "description"?, "strict"?}``."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesRequest(_Strict):
    """POST /v1/responses (OpenAI names and ranges)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None  # unset: one call per response
    # Prefix-cache namespace (vLLM's field, as on the chat routes).
    cache_salt: str | None = Field(None, min_length=1)
    # Scheduling extensions, as on the chat routes (`protocol.sched_options`).
    priority: int | None = None
    slo_ttft_ms: float | None = Field(None, gt=0)
    slo_tpot_ms: float | None = Field(None, gt=0)
    # Accepted and ignored (IGNORED).
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    stream_options: dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None

    def warn_ignored(self, strict: bool = False) -> None:
        """Log one warning naming the set fields radixlm ignores and the unknown ones; with
        `strict` (--strict-request-fields) an unknown field is a 400 unknown_parameter, as
        on the other generation routes."""
        extra = unknown_fields(self)
        if strict and extra:
            raise unknown_parameter(extra[0])
        _check_metadata(self.metadata)
        names = [n for n in IGNORED if getattr(self, n) is not None] + extra
        if self.text is not None and self.text.verbosity is not None:
            names.append("text.verbosity")
        if self.background:
            raise invalid_request(
                "'background' responses are not supported", "background", "unsupported_parameter"
            )
        if names:
            logger.warning("/v1/responses: ignoring unsupported fields: %s", ", ".join(names))


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """400 (param ``metadata``) past OpenAI's bounds: at most 16 pairs, keys of at most
    64 characters, values of at most 512."""
    if metadata is None:
        return
    if len(metadata) > METADATA_PAIRS:
        raise invalid_request(
            f"'metadata' may hold at most {METADATA_PAIRS} pairs, got {len(metadata)}",
            param="metadata",
        )
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS:
            raise invalid_request(
                f"'metadata' keys may have at most {METADATA_KEY_CHARS} characters, "
                f"got {len(key)} in {key[:METADATA_KEY_CHARS]!r}...",
                param="metadata",
            )
        if len(value) > METADATA_VALUE_CHARS:
            raise invalid_request(
                f"'metadata' values may have at most {METADATA_VALUE_CHARS} characters, "
                f"got {len(value)} for key {key!r}",
                param="metadata",
            )


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat-shaped tools of flat Responses function tools. Raises APIError (400)."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise invalid_request(
                f"tool type {tool.get('type')!r} is not supported (only 'function')",
                param=f"tools.{i}.type",
                code="unsupported_parameter",
            )
        fn = {k: v for k, v in tool.items() if k != "type" and v is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(
    choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None
) -> tuple[str | dict[str, Any] | None, list[dict[str, Any]] | None]:
    """The chat ``tool_choice`` and tools of a Responses choice over chat-shaped `tools`.

    A named function is flat in the Responses API (``{"type": "function", "name"}``);
    ``{"type": "allowed_tools", "mode": "auto" | "required", "tools": [{"type":
    "function", "name"}, ...]}`` keeps only the listed tools, with `mode` as the choice.
    Raises APIError (400, param tool_choice).
    """
    if not isinstance(choice, dict):
        return choice, tools
    if choice.get("type") == "function" and set(choice) == {"type", "name"}:
        return {"type": "function", "function": {"name": choice["name"]}}, tools
    allowed = choice.get("tools")
    if (
        choice.get("type") != "allowed_tools"
        or choice.get("mode") not in ("auto", "required")
        or not isinstance(allowed, list)
        or not all(isinstance(t, dict) and t.get("type") == "function" for t in allowed)
    ):
        raise invalid_request(
            "'tool_choice' must be 'none', 'auto', 'required', "
            '{"type": "function", "name": ...} or {"type": "allowed_tools", "mode": "auto" | '
            '"required", "tools": [{"type": "function", "name": ...}]}',
            param="tool_choice",
        )
    names = {t.get("name") for t in allowed}
    known = {t["function"].get("name") for t in tools or []}
    if not names <= known:
        raise invalid_request(
            f"tool_choice.tools names functions not in 'tools': {sorted(map(str, names - known))}",
            param="tool_choice.tools",
        )
    return choice["mode"], [t for t in tools or [] if t["function"].get("name") in names]


def response_format(text: TextConfig | None) -> dict[str, Any] | None:
    """The chat ``response_format`` of ``text.format``. Raises APIError (400)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("name"), str):
            raise invalid_request(
                "text.format of type 'json_schema' needs a string 'name'", "text.format.name"
            )
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    raise invalid_request(
        "text.format.type must be 'text', 'json_object' or 'json_schema'",
        param="text.format.type",
    )


def to_chat(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat completion request equivalent to `req` over `messages` (the conversation:
    earlier turns of ``previous_response_id`` then ``input``). Raises APIError (400)."""
    if req.instructions is not None:
        messages = [{"role": "system", "content": req.instructions}, *messages]
    tool_choice, tools = chat_tool_choice(req.tool_choice, chat_tools(req.tools))
    body = {
        "model": req.model,
        "messages": [ChatMessage.model_validate(m) for m in messages],
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format(req.text),
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
    }
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


def unknown_parameter(param: str) -> APIError:
    """The 400 of an unknown field (``--strict-request-fields``), as the chat routes'."""
    return invalid_request(
        f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
    )


def responses_param(err: APIError) -> APIError:
    """`err` with a chat field name in its param replaced by the Responses one."""
    param = err.param
    if param is None:
        return err
    if param == "messages" or param.startswith("messages."):
        # Chat message indices count the instructions and earlier turns: not input's.
        param = "input"
    for chat, ours in _PARAMS:
        if param == chat or param.startswith(chat + "."):
            param = ours + param[len(chat) :]
            break
    if param.startswith("tools.") and ".function." in param:
        param = param.replace(".function.", ".", 1)
    if err.code == "unknown_parameter":
        return unknown_parameter(param)
    err.param = param
    return err


_PARAMS: tuple[tuple[str, str], ...] = (
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
)
