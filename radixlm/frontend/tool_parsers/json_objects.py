"""Calls written as a sequence of JSON objects ``{"name": ..., "<args key>": {...}}``
(Llama 3 JSON calls, Mistral's ``[TOOL_CALLS]`` list), parsed as a prefix."""

from __future__ import annotations

import re

from radixlm.frontend.tool_parsers.base import (
    ToolCall,
    call_from_json,
    json_value_end,
    unescape,
)


def head_pattern(arg_keys: tuple[str, ...]) -> re.Pattern[str]:
    """``{"name": "<name>", "<one of arg_keys>": `` (the head of a call that streams)."""
    keys = "|".join(re.escape(k) for k in arg_keys)
    return re.compile(rf'\{{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:{keys})"\s*:\s*')


def object_calls(
    text: str,
    pos: int,
    head: re.Pattern[str],
    arg_keys: tuple[str, ...],
    seps: str,
    close: str | None = None,
) -> tuple[list[ToolCall], bool]:
    """The calls in `text` from `pos`: objects separated by whitespace and `seps`,
    ending at `close` (e.g. ``]``) or at anything that is not an object.

    Returns (calls, cut): cut is True when the text ends inside an object, or before
    `close`. A call whose object starts with the `head` streams (partial arguments text
    while open); another object is reported once complete; a complete object that is no
    call ends the sequence.
    """
    calls: list[ToolCall] = []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] in seps):
            pos += 1
        if pos == len(text):
            return calls, close is not None
        if close is not None and text[pos] == close or text[pos] != "{":
            return calls, False
        end = json_value_end(text, pos)
        m = head.match(text, pos)
        if m is not None and m.end() < len(text) and text[m.end()] in "{[":
            args_end = json_value_end(text, m.end())
            done = end is not None and call_from_json(text[pos:end], arg_keys) is not None
            calls.append(ToolCall(unescape(m.group(1)), text[m.end() : args_end], done))
        elif end is not None:
            call = call_from_json(text[pos:end], arg_keys)
            if call is None:
                return calls, False
            calls.append(call)
        if end is None:
            return calls, True
        pos = end
