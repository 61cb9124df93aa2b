"""Mistral calls after ``[TOOL_CALLS]``, in either of Mistral's two formats.

* List (tokenizer v3 to v7): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``,
  the calls being the objects of the JSON list, in order.
* Named (tokenizer v11 and later: Mistral Small 3.2, Magistral, Devstral):
  ``[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}``, the pattern repeated per call
  (``[TOOL_CALLS]`` before each).

The text after the first ``[TOOL_CALLS]`` says which: a ``[`` starts a list, anything
else a named call. Content is the text before ``[TOOL_CALLS]`` (trailing whitespace
removed); text after the calls is dropped. Forced calls are written in the named format
when the chat template uses it (``[ARGS]`` in its source), else as a list. Source:
Mistral's tokenizer formats (mistral-common), as vLLM's and SGLang's ``mistral``
parsers read them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.frontend.tool_parsers.base import (
    Scan,
    ToolCall,
    ToolParser,
    call_tag,
    calls_format,
    held_back,
    json_value_end,
)
from radixlm.frontend.tool_parsers.json_objects import head_pattern, object_calls

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_KEYS = ("arguments", "parameters")
_HEAD = head_pattern(_KEYS)
_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]\s*")
# A prefix of `_NAMED` that has not reached [ARGS] yet.
_MAY_NAMED = re.compile(r"\s*[A-Za-z0-9_.\-]*(\[(A(R(G(S)?)?)?)?)?")


def _named_calls(text: str, pos: int) -> tuple[list[ToolCall], bool]:
    """The calls of the named format from `pos` (just after the first [TOOL_CALLS]) and
    whether the text ends inside one."""
    calls: list[ToolCall] = []
    while True:
        head = _NAMED.match(text, pos)
        if head is None:
            return calls, bool(_MAY_NAMED.fullmatch(text, pos))
        start = head.end()
        if start == len(text):
            return calls, True
        if text[start] != "{":
            return calls, False  # arguments that are no object: malformed
        end = json_value_end(text, start)
        calls.append(ToolCall(head.group(1), text[start:end], complete=end is not None))
        if end is None:
            return calls, True
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if not text.startswith(TOOL_CALLS, pos):
            return calls, False
        pos += len(TOOL_CALLS)


class MistralParser(ToolParser):
    """named: forced calls use the named format (parsing reads both)."""

    name = "mistral"

    def __init__(self, named: bool = False):
        self.named = named

    def forced_format(self, tools: list[tuple[str, dict[str, Any]]], parallel: bool) -> dict:
        if self.named:
            tags = [call_tag(f"{TOOL_CALLS}{n}{ARGS}", s, "") for n, s in tools]
            return calls_format(tags, "", parallel)
        tags = [call_tag(f'{{"name": {json.dumps(n)}, "arguments": ', s, "}") for n, s in tools]
        return calls_format(tags, ", ", parallel, (f"{TOOL_CALLS}[", "]"))

    def scan(self, text: str, final: bool) -> Scan:
        first = text.find(TOOL_CALLS)
        if first < 0:
            if final:
                return Scan(text)
            return Scan(text[: len(text) - held_back(text, (TOOL_CALLS,))].rstrip())
        content = text[:first].rstrip()
        pos = first + len(TOOL_CALLS)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return Scan(content, found=True, cut=True)
        if text[pos] != "[":
            calls, cut = _named_calls(text, pos)
            return Scan(content, calls, found=True, cut=cut)
        calls, cut = object_calls(text, pos + 1, _HEAD, _KEYS, ",", "]")
        return Scan(content, calls, found=True, cut=cut)
