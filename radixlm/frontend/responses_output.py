"""Response objects of the Responses API: output items, usage and the response body.

Shapes follow the OpenAI API reference ("The response object"):

* a ``message`` output item: ``{"id": "msg_...", "type": "message", "role":
  "assistant", "status", "content": [{"type": "output_text", "text", "annotations": [],
  "logprobs": []}]}``;
* a ``function_call`` output item: ``{"id": "fc_...", "type": "function_call", "status":
  "completed", "call_id": "call_...", "name", "arguments"}`` (arguments: JSON text);
* a ``reasoning`` output item (with ``--reasoning-parser``, before the others):
  ``{"id": "rs_...", "type": "reasoning", "summary": [], "status", "content":
  [{"type": "reasoning_text", "text"}]}``, the model's reasoning as the API returns an
  open-weight model's raw reasoning (the ``<think>`` markers left out);
* ``usage``: ``input_tokens``, ``input_tokens_details.cached_tokens`` (prompt tokens
  served from the prefix cache), ``output_tokens``, ``output_tokens_details.
  reasoning_tokens`` (the tokens of the reasoning text, re-encoded; 0 without a
  reasoning item), ``total_tokens``.

A response is ``completed``, or ``incomplete`` with ``incomplete_details.reason``
``"max_output_tokens"`` when generation stopped at the token budget (or the context).
"""

from __future__ import annotations

import uuid
from typing import Any

from radixlm.frontend.reasoning import ReasoningParser
from radixlm.frontend.responses_protocol import ResponsesRequest
from radixlm.frontend.tool_parsers import ToolParser, new_call_id
from radixlm.runtime.sched.finish import FinishReason


def item_id(prefix: str) -> str:
    """An output item id: ``msg_`` / ``fc_`` / ``rs_`` + 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str | None, status: str) -> dict[str, Any]:
    """A message item; `text` None: no content part yet (a streamed item just opened)."""
    content = [] if text is None else [text_part(text)]
    return {"id": mid, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(rid: str, text: str | None, status: str) -> dict[str, Any]:
    """A reasoning item; `text` None: no content part yet (a streamed item just opened)."""
    content = [] if text is None else [reasoning_part(text)]
    return {"id": rid, "type": "reasoning", "summary": [], "status": status, "content": content}


def call_item(fid: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": fid,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def status_of(finish_reason: str | None) -> str:
    """``incomplete`` when the token budget ended the output, else ``completed``."""
    return "incomplete" if finish_reason == FinishReason.LENGTH else "completed"


def output_items(
    text: str, parser: ToolParser | None, status: str, reasoning: ReasoningParser | None = None
) -> list[dict[str, Any]]:
    """The output items of a finished generation's `text`: a reasoning item when
    `reasoning` splits some off (None: no reasoning parser), a message with the text
    before any tool call (left out when empty and another item was made), then one
    function_call item per complete call `parser` finds (None: no tools; an
    ``incomplete`` output drops a call it cut, markup included, as `ToolParser.parse`
    does)."""
    items = []
    if reasoning is not None:
        thought, text = reasoning.split(text)
        if thought:
            items.append(reasoning_item(item_id("rs"), thought, status))
    if parser is not None:
        content, calls = parser.parse(text, cut=status == "incomplete")
    else:
        content, calls = text, []
    if content or not (calls or items):
        items.append(message_item(item_id("msg"), content or "", status))
    for call in calls:
        fid = item_id("fc")
        items.append(call_item(fid, new_call_id(), call.name, call.arguments, "completed"))
    return items


def assistant_turn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat assistant message (ChatMessage fields) of a response's output items, as a
    later turn renders it."""
    texts = [p["text"] for it in items if it["type"] == "message" for p in it["content"]]
    calls = [
        {
            "id": it["call_id"],
            "type": "function",
            "function": {"name": it["name"], "arguments": it["arguments"]},
        }
        for it in items
        if it["type"] == "function_call"
    ]
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        turn["tool_calls"] = calls
    elif turn["content"] is None:
        turn["content"] = ""
    return turn


def reasoning_text(items: list[dict[str, Any]]) -> str:
    """The text of a response's reasoning items ("" when none)."""
    return "".join(p["text"] for it in items if it["type"] == "reasoning" for p in it["content"])


def usage(counts: dict[str, int] | None, reasoning_tokens: int = 0) -> dict[str, Any] | None:
    """Responses usage from a finished request's {prompt_tokens, completion_tokens,
    cached_tokens}; `reasoning_tokens` of them were reasoning."""
    if counts is None:
        return None
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": counts["cached_tokens"]},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"],
    }


def response_body(
    rid: str,
    created: int,
    model: str,
    req: ResponsesRequest,
    status: str,
    output: list[dict[str, Any]],
    counts: dict[str, int] | None,
    reasoning_tokens: int = 0,
) -> dict[str, Any]:
    """The response object; `status` in_progress / completed / incomplete; `counts` the
    runtime usage (None while in progress), `reasoning_tokens` of its output tokens."""
    fmt = req.text.format if req.text is not None and req.text.format else {"type": "text"}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": bool(req.parallel_tool_calls),
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt},
        "tool_choice": "auto" if req.tool_choice is None else req.tool_choice,
        "tools": req.tools or [],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "usage": usage(counts, reasoning_tokens),
        "user": req.user,
        "metadata": req.metadata or {},
    }
