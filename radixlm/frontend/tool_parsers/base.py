"""The tool-call parser interface: complete-text parse and incremental stream.

A parser reads one model family's calling convention. It implements `scan`, a *prefix
parse*: for any prefix of an output it returns the content known so far and the calls
known so far, with this invariant (what makes streaming exact): scanning a longer prefix
gives a content of which the earlier one is a prefix, the same calls in the same order
with the same names, and argument texts of which the earlier ones are prefixes. Text
that may still turn into markup (a partial start tag) is held back from content.

On that one method the base class builds:

* `ToolParser.parse(text, cut=False) -> Parsed(content, calls)`: the complete calls
  (arguments valid JSON object text). A call cut short (by ``max_tokens``) is dropped,
  and so is its markup: content is the text before the calls (None when empty). When markup is found
  but no call in it parses (malformed), the whole text is the content, as SGLang and
  vLLM answer.
* `ToolParser.stream() -> ToolStream`: ``feed(delta) -> Delta`` and ``finish(cut=False)
  -> Delta``; a `Delta` holds a content piece and `CallDelta` fragments (a call's first
  fragment has its index, id and name; the next ones argument pieces). For a well-formed
  output the fragments join to exactly `parse`'s calls and the content pieces to its
  content. A call already started when the output is cut stays as sent (fragments cannot
  be taken back; the finish reason ``length`` tells the client), and markup never
  reaches the content pieces once a call has started.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass
class ToolCall:
    """One call: function name and arguments JSON text (complete or a prefix).

    complete: the call's markup/JSON is closed (False for a call cut short; not compared).
    """

    name: str
    arguments: str
    complete: bool = field(default=True, compare=False)


class Parsed(NamedTuple):
    """content: message text (None when empty and markup was found); calls in order."""

    content: str | None
    calls: list[ToolCall]


@dataclass
class Scan:
    """A prefix parse: content so far, calls so far, whether call markup was found, and
    whether the text ends inside unclosed markup (a call cut short)."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    found: bool = False
    cut: bool = False


@dataclass
class CallDelta:
    """A streamed tool-call fragment: the first of a call has id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The ``delta.tool_calls`` entry of a chat.completion.chunk."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Delta:
    """What one `ToolStream.feed` / `finish` adds: a content piece and call fragments."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


def new_call_id() -> str:
    """An OpenAI-style tool call id (``call_`` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """Characters at the end of `text` that may begin one of `markers`."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[-n:]):
                best = n
                break
    return best


def json_value_end(text: str, start: int) -> int | None:
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


def unescape(name: str) -> str:
    """A JSON string body (without quotes) decoded; unchanged when not valid JSON."""
    try:
        return json.loads(f'"{name}"')
    except json.JSONDecodeError:
        return name


def call_from_json(body: str, arg_keys: tuple[str, ...] = ("arguments", "parameters")):
    """The call in a JSON object text ``{"name": ..., <arg key>: {...}}``, or None when it
    is not such an object. Arguments given as a string are kept as that string."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text)


def valid_arguments(call: ToolCall) -> bool:
    """The call is complete and its arguments are a JSON object."""
    if not call.complete:
        return False
    try:
        return isinstance(json.loads(call.arguments), dict)
    except json.JSONDecodeError:
        return False


def call_tag(begin: str, schema: dict[str, Any], end: str) -> dict[str, Any]:
    """An xgrammar structural-tag ``tag``: `begin`, JSON matching `schema`, `end`."""
    return {
        "type": "tag",
        "begin": begin,
        "content": {"type": "json_schema", "json_schema": schema},
        "end": end,
    }


def calls_format(
    tags: list[dict[str, Any]], separator: str, parallel: bool, around: tuple[str, str] = ("", "")
) -> dict[str, Any]:
    """An xgrammar structural-tag format: at least one of `tags` (exactly one unless
    `parallel`), joined by `separator`, inside the constant strings `around` (before,
    after; empty ones left out)."""
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": not parallel,
    }
    if around == ("", ""):
        return calls
    before, after = around
    elements = [{"type": "const_string", "value": before}] if before else []
    elements.append(calls)
    elements += [{"type": "const_string", "value": after}] if after else []
    return {"type": "sequence", "elements": elements}


class ToolParser:
    """One calling convention. Subclasses set `name` and implement `scan` and
    `forced_format`."""

    name = ""

    def forced_format(self, tools: list[tuple[str, dict[str, Any]]], parallel: bool) -> dict:
        """The xgrammar structural-tag format (the ``format`` member of a
        ``{"type": "structural_tag"}`` spec) of an output that is nothing but calls in
        this convention: one (several when `parallel`) call of the `tools` (name,
        parameters JSON schema) with arguments matching the schema. `parse` reads every
        text it accepts as those calls (what ``tool_choice`` ``required`` or a named
        function is enforced with)."""
        raise NotImplementedError

    def scan(self, text: str, final: bool) -> Scan:
        """Prefix parse of `text` (see the module docstring); `final`: no more text comes,
        so nothing is held back. Never raises on any input."""
        raise NotImplementedError

    def parse(self, text: str, cut: bool = False) -> Parsed:
        """Content and complete calls of a finished output (see the module docstring).
        cut: the output was cut by ``max_tokens``, so trailing text that may begin markup
        (``<tool_c``) is the start of a call and is dropped too."""
        scan = self.scan(text, final=True)
        if not scan.found:
            held = self.scan(text, final=False) if cut else scan
            if not held.found and held.content != text.rstrip():
                return Parsed(held.content or None, [])
            return Parsed(text, [])
        calls = [c for c in scan.calls if valid_arguments(c)]
        if not calls and not scan.cut:  # markup that holds no call: malformed, keep the text
            return Parsed(text, [])
        return Parsed(scan.content or None, calls)

    def stream(self) -> ToolStream:
        """A new incremental parser for one output."""
        return ToolStream(self)


class ToolStream:
    """Turns text deltas into content pieces and call fragments (see `ToolParser`)."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.text = ""
        self.content_sent = 0
        self.ids: list[str] = []
        self.args_sent: list[int] = []

    @property
    def has_calls(self) -> bool:
        """Whether a call fragment was sent."""
        return bool(self.ids)

    def feed(self, delta: str) -> Delta:
        """Add a text delta; returns what can be sent now."""
        self.text += delta
        return self._diff(self.parser.scan(self.text, final=False))

    def finish(self, cut: bool = False) -> Delta:
        """The output is complete (`cut`: by ``max_tokens``, see `ToolParser.parse`):
        returns what was held back."""
        scan = self.parser.scan(self.text, final=True)
        if not self.ids:
            content, calls = self.parser.parse(self.text, cut)
            scan = Scan(content or "", calls)
        return self._diff(scan)

    def _diff(self, scan: Scan) -> Delta:
        out = Delta(scan.content[self.content_sent :])
        self.content_sent = max(self.content_sent, len(scan.content))
        for i, call in enumerate(scan.calls):
            if i == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(0)
                out.calls.append(CallDelta(i, self.ids[i], call.name, ""))
            piece = call.arguments[self.args_sent[i] :]
            if piece:
                self.args_sent[i] = len(call.arguments)
                out.calls.append(CallDelta(i, arguments=piece))
        return out
