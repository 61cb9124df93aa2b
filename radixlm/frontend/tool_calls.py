"""Tool-call parsing: model text -> OpenAI ``tool_calls``, whole or as stream fragments.

Calling convention (Hermes / Qwen2.5 style; `tool_prompt.py` teaches it to the model and
its grammar forces it for ``tool_choice`` required / named)::

    optional text<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The message ``content`` is the text before the first ``<tool_call>`` (trailing
whitespace removed; None when empty); text after the calls is dropped. A call's
``arguments`` is the model's own JSON text of the arguments value when the body starts
``{"name": "...", "arguments": `` (so it can stream), else the re-serialised
``arguments`` (or ``parameters``) of the body parsed as JSON once the call is closed.

Streaming invariant: parsing a prefix of the text gives a content that is a prefix of
the final content, the same calls in the same order with the same names, and argument
texts that are prefixes of the final ones; so the streamed fragments (`ToolCallStream`)
concatenate to exactly the non-streamed message.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixlm.frontend.formats import ChatFormat
from radixlm.runtime.sched.finish import FinishReason

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass
class ToolCall:
    """One parsed call: function name and arguments JSON text (complete or a prefix)."""

    name: str
    arguments: str


@dataclass
class Parsed:
    """content: text before the first call (None when empty and calls were found)."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)


def new_call_id() -> str:
    """An OpenAI-style tool call id (``call_`` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _held_back(text: str) -> int:
    """Characters at the end of `text` that may begin a ``<tool_call>`` tag."""
    for n in range(min(len(CALL_START) - 1, len(text)), 0, -1):
        if CALL_START.startswith(text[-n:]):
            return n
    return 0


def _json_value_end(text: str, start: int) -> int | None:
    """End index (exclusive) of the JSON object or array starting at `start`, or None
    when it is not complete in `text` (strings and escapes are skipped)."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _parse_call(body: str, closed: bool) -> ToolCall | None:
    """The call in one ``<tool_call>`` body (text up to ``</tool_call>`` or the end).

    Streams (returns a partial call) only when the body has the ``{"name": "...",
    "arguments": {`` head; other bodies are parsed as JSON once `closed`.
    """
    head = _HEAD.match(body)
    if head is not None:
        start = head.end()
        if start == len(body):
            return None if not closed else ToolCall(_unescape(head.group(1)), "")
        if body[start] in "{[":
            end = _json_value_end(body, start)
            return ToolCall(_unescape(head.group(1)), body[start:end])
    if not closed:
        return None
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text)


def _unescape(name: str) -> str:
    try:
        return json.loads(f'"{name}"')
    except json.JSONDecodeError:
        return name


def parse_tool_calls(text: str, final: bool = True) -> Parsed:
    """Split model output into content and tool calls.

    Args:
        text: the output so far. final: whether the output is complete; while it is
            not, text that may still become part of a tag or trailing whitespace before
            a call is held back, and calls are reported only as far as known.
    Returns:
        Parsed(content, calls). With no call found in a final text, content is the whole
        text (unchanged).
    """
    first = text.find(CALL_START)
    if first < 0:
        if final:
            return Parsed(text)
        kept = text[: len(text) - _held_back(text)]
        return Parsed(kept.rstrip())
    calls = []
    blocks = text[first + len(CALL_START) :].split(CALL_START)
    for i, block in enumerate(blocks):
        closed = CALL_END in block or i < len(blocks) - 1 or final
        call = _parse_call(block.split(CALL_END, 1)[0], closed)
        if call is not None:
            calls.append(call)
        elif not closed:
            break
    content = text[:first].rstrip()
    if final and not calls:
        return Parsed(text)
    return Parsed(content or (None if final else ""), calls)


class ToolCallStream:
    """Turns streamed text deltas into content deltas and ``delta.tool_calls`` fragments.

    Each call first gets ``{"index", "id", "type": "function", "function": {"name",
    "arguments": ""}}``, then ``{"index", "function": {"arguments": piece}}`` fragments.
    """

    def __init__(self) -> None:
        self.text = ""
        self.content_sent = 0
        self.ids: list[str] = []
        self.args_sent: list[int] = []

    @property
    def has_calls(self) -> bool:
        return bool(self.ids)

    def feed(self, delta: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """Add a text delta; returns (new content text, new tool-call fragments)."""
        self.text += delta
        parsed = parse_tool_calls(self.text, final)
        content = parsed.content or ""
        new_content = content[self.content_sent :]
        self.content_sent = max(self.content_sent, len(content))
        frags: list[dict[str, Any]] = []
        for i, call in enumerate(parsed.calls):
            if i == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(0)
                frags.append(
                    {
                        "index": i,
                        "id": self.ids[i],
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            piece = call.arguments[self.args_sent[i] :]
            if piece:
                self.args_sent[i] = len(call.arguments)
                frags.append({"index": i, "function": {"arguments": piece}})
        return new_content, frags


def message_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """OpenAI ``message.tool_calls`` entries for parsed calls (fresh ids)."""
    return [
        {
            "id": new_call_id(),
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in calls
    ]


def tool_finish_reason(reason: FinishReason | None, has_calls: bool) -> str | None:
    """A request that stopped after emitting calls finishes with ``tool_calls`` (an
    OpenAI reason the runtime does not have)."""
    return "tool_calls" if reason == FinishReason.STOP and has_calls else reason


class ToolChatFormat(ChatFormat):
    """ChatFormat whose output is parsed for tool calls (requests with tools rendered)."""

    def __init__(self, id: str, created: int, model: str, **kwargs: Any):  # noqa: A002
        super().__init__(id, created, model, **kwargs)
        self._streams: dict[int, ToolCallStream] = {}

    def deltas(self, index: int, chunk: dict[str, Any], include_usage: bool) -> list[dict]:
        stream = self._streams.setdefault(index, ToolCallStream())
        reason = chunk["finish_reason"]
        content, frags = stream.feed(chunk["text"], final=reason is not None)
        text_only = {**chunk, "text": content, "finish_reason": None}
        out = super().deltas(index, text_only, include_usage)
        if frags:
            choice = self._choice(index, {"tool_calls": frags})
            out.append(self._chunk(choice, include_usage))
        if reason is not None:
            final = tool_finish_reason(reason, stream.has_calls)
            done = {**chunk, "text": "", "finish_reason": final, "output_logprobs": None}
            out.extend(super().deltas(index, done, include_usage))
        return out

    def full_choice(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        choice = super().full_choice(index, result)
        parsed = parse_tool_calls(result["text"], final=True)
        if parsed.calls:
            choice["message"]["content"] = parsed.content
            choice["message"]["tool_calls"] = message_tool_calls(parsed.calls)
        choice["finish_reason"] = tool_finish_reason(result["finish_reason"], bool(parsed.calls))
        return choice
