"""Hermes / Qwen2.5 / Qwen3 calls: ``<tool_call>{json}</tool_call>``, one block per call.

::

    optional text<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

This is also the convention radixlm teaches a model whose chat template renders no tools
(`tool_prompt.py`), and the only one whose calls ``auto`` tool choices constrain
(triggered tags). Content is the text before the first ``<tool_call>`` (trailing
whitespace removed); text after the calls is dropped. A call's ``arguments`` is the
model's own JSON text of the arguments value when the body starts
``{"name": "...", "arguments": `` (so it streams), else the re-serialised
``arguments`` (or ``parameters``) of the body once it is closed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.frontend.tool_parsers.base import (
    Scan,
    ToolCall,
    ToolParser,
    call_from_json,
    call_tag,
    calls_format,
    held_back,
    json_value_end,
    unescape,
)

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def _parse_body(body: str, closed: bool) -> ToolCall | None:
    """The call in one ``<tool_call>`` body (text up to ``</tool_call>`` or the end).

    A body with the ``{"name": "...", "arguments": {`` head streams (a partial call while
    its JSON is open); other bodies are parsed as JSON once `closed`. None: nothing known
    yet, or a closed body that is no call.
    """
    head = _HEAD.match(body)
    if head is not None:
        start = head.end()
        name = unescape(head.group(1))
        if start == len(body):
            return ToolCall(name, "", complete=False) if closed else None
        if body[start] in "{[":
            end = json_value_end(body, start)
            done = end is not None and call_from_json(body) is not None
            return ToolCall(name, body[start:end], complete=done)
    if not closed:
        return None
    return call_from_json(body)


def hermes_tag(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The structural tag of one call of `name` (arguments matching `schema`)."""
    begin = f'{CALL_START}\n{{"name": {json.dumps(name)}, "arguments": '
    return call_tag(begin, schema, f"}}\n{CALL_END}")


class HermesParser(ToolParser):
    name = "hermes"

    def forced_format(self, tools: list[tuple[str, dict[str, Any]]], parallel: bool) -> dict:
        return calls_format([hermes_tag(n, s) for n, s in tools], "\n", parallel)

    def scan(self, text: str, final: bool) -> Scan:
        first = text.find(CALL_START)
        if first < 0:
            if final:
                return Scan(text)
            return Scan(text[: len(text) - held_back(text, (CALL_START,))].rstrip())
        calls = []
        blocks = text[first + len(CALL_START) :].split(CALL_START)
        for i, block in enumerate(blocks):
            closed = CALL_END in block or i < len(blocks) - 1 or final
            call = _parse_body(block.split(CALL_END, 1)[0], closed)
            if call is not None:
                calls.append(call)
            elif not closed:
                break
        cut = CALL_END not in blocks[-1]
        return Scan(text[:first].rstrip(), calls, found=True, cut=cut)
