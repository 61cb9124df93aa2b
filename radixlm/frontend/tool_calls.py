"""Chat output parsing: reasoning and tool calls -> OpenAI message fields, whole or streamed.

`ToolChatFormat` is the chat format of a request whose output is parsed: with tools
rendered, by the server's tool-call parser (`tool_parsers`, ``--tool-call-parser``);
with ``--reasoning-parser``, by a `ReasoningParser` first (its reasoning goes to
``reasoning_content``, the rest on to the tool parser).

Non-streamed: ``message.content`` is what the tool parser leaves as content,
``message.tool_calls`` the complete calls (fresh ids), ``message.reasoning_content`` the
reasoning (None when empty; only with a reasoning parser). A call cut by ``max_tokens``
is dropped with its markup (a partial start tag too) and the finish reason stays
``length``; markup that holds no
call (malformed) stays in the content with the finish reason unchanged. A request that
stopped after emitting calls finishes with ``tool_calls``.

Streamed: ``delta.reasoning_content`` pieces, ``delta.content`` pieces and
``delta.tool_calls`` fragments (a call's first fragment has index, id, type and name,
the next ones argument pieces) that join to the non-streamed message for well-formed
output (see `tool_parsers/base.py` for a call cut mid-stream).
"""

from __future__ import annotations

from typing import Any

from radixlm.frontend.formats import ChatFormat
from radixlm.frontend.reasoning import ReasoningParser, ReasoningStream
from radixlm.frontend.tool_parsers import Parsed, ToolCall, ToolParser, new_call_id
from radixlm.frontend.tool_parsers.hermes import HermesParser
from radixlm.frontend.tool_prompt import ToolSetup
from radixlm.runtime.sched.finish import FinishReason

_HERMES = HermesParser()


def parse_tool_calls(text: str, final: bool = True) -> Parsed:
    """The Hermes prefix parse of `text` as a `Parsed`: content (text before the calls,
    None when empty; the whole text when no call was found in a final text) and every
    call found, a cut one included (its arguments a prefix). `final`: nothing more comes
    (while False, text that may begin a tag is held back)."""
    scan = _HERMES.scan(text, final)
    if final and not scan.calls:
        return Parsed(text, [])
    return Parsed(scan.content or (None if final else ""), scan.calls)


class ToolCallStream:
    """One streamed choice's tool calls: text deltas -> (content piece, OpenAI
    ``delta.tool_calls`` fragments). parser: the tool-call parser (Hermes by default)."""

    def __init__(self, parser: ToolParser = _HERMES):
        self._stream = parser.stream()

    @property
    def has_calls(self) -> bool:
        return self._stream.has_calls

    def feed(self, delta: str, final: bool, cut: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """Add a text delta (`final`: it is the last; `cut`: the output was cut by
        ``max_tokens``); returns new content and fragments."""
        got = self._stream.feed(delta)
        content, calls = got.content, got.calls
        if final:
            rest = self._stream.finish(cut)
            content, calls = content + rest.content, calls + rest.calls
        return content, [c.to_openai() for c in calls]


def output_tool_parser(
    configured: ToolParser, tools: ToolSetup, native_tools: bool
) -> ToolParser | None:
    """The parser of one request's output: None without tools; `configured` (the
    server's ``--tool-call-parser``) when the call is forced (the forcing grammar writes
    its convention) or the template renders tools (`native_tools`); else Hermes (the
    template renders no tools, so `tool_prompt` teaches Hermes)."""
    if not tools.active:
        return None
    if tools.forced is not None or native_tools:
        return configured
    return _HERMES


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


class _ChoiceStream:
    """The parsers' state for one streamed choice."""

    def __init__(self, tools: ToolParser | None, reasoning: ReasoningParser | None):
        self.tools = ToolCallStream(tools) if tools is not None else None
        self.reasoning: ReasoningStream | None = reasoning.stream() if reasoning else None

    def feed(self, text: str, reason: str | None) -> tuple[str, str, list[dict[str, Any]]]:
        """(reasoning piece, content piece, tool-call fragments) for a text delta;
        reason: the finish reason (None before the last delta)."""
        reasoning, final = "", reason is not None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.feed(text, final)
        frags: list[dict[str, Any]] = []
        if self.tools is not None:
            text, frags = self.tools.feed(text, final, cut=reason == FinishReason.LENGTH)
        return reasoning, text, frags


class ToolChatFormat(ChatFormat):
    """ChatFormat whose output is parsed (see the module docstring).

    tool_parser: parses tool calls (None: tools are not rendered); reasoning: splits
    reasoning out first (None: no reasoning parser, or the request keeps it in content).
    Logprobs list every generated token (reasoning and markup included), as the plain
    chat format's do.
    """

    def __init__(
        self,
        id: str,  # noqa: A002
        created: int,
        model: str,
        tool_parser: ToolParser | None = _HERMES,
        reasoning: ReasoningParser | None = None,
        **kwargs: Any,
    ):
        super().__init__(id, created, model, **kwargs)
        self.tool_parser = tool_parser
        self.reasoning = reasoning
        self._streams: dict[int, _ChoiceStream] = {}

    def deltas(self, index: int, chunk: dict[str, Any], include_usage: bool) -> list[dict]:
        stream = self._streams.setdefault(index, _ChoiceStream(self.tool_parser, self.reasoning))
        reason = chunk["finish_reason"]
        reasoning, content, frags = stream.feed(chunk["text"], reason)
        out = []
        if reasoning:
            choice = self._choice(index, {"reasoning_content": reasoning})
            out.append(self._chunk(choice, include_usage))
        out += super().deltas(
            index, {**chunk, "text": content, "finish_reason": None}, include_usage
        )
        if frags:
            out.append(self._chunk(self._choice(index, {"tool_calls": frags}), include_usage))
        if reason is not None:
            has_calls = stream.tools is not None and stream.tools.has_calls
            done = {"text": "", "finish_reason": tool_finish_reason(reason, has_calls)}
            out.extend(super().deltas(index, done, include_usage))
        return out

    def full_choice(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        choice = super().full_choice(index, result)
        message, text = choice["message"], result["text"]
        if self.reasoning is not None:
            reasoning, text = self.reasoning.split(text)
            message["reasoning_content"] = reasoning or None
            message["content"] = text or None
        calls: list[ToolCall] = []
        if self.tool_parser is not None:
            cut = result["finish_reason"] == FinishReason.LENGTH
            content, calls = self.tool_parser.parse(text, cut)
            if content != text or calls:
                message["content"] = content
            if calls:
                message["tool_calls"] = message_tool_calls(calls)
        choice["finish_reason"] = tool_finish_reason(result["finish_reason"], bool(calls))
        return choice
