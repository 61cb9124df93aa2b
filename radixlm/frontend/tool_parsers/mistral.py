"""Mistral calls: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``.

Content is the text before ``[TOOL_CALLS]`` (trailing whitespace removed); the calls are
the objects of the JSON list after it, in order (parallel calls are several objects).
Text after the list is dropped. Source: Mistral's v3 tokenizer format, as vLLM's
``mistral`` parser reads it.
"""

from __future__ import annotations

from radixlm.frontend.tool_parsers.base import Scan, ToolParser, held_back
from radixlm.frontend.tool_parsers.json_objects import head_pattern, object_calls

TOOL_CALLS = "[TOOL_CALLS]"
_KEYS = ("arguments", "parameters")
_HEAD = head_pattern(_KEYS)


class MistralParser(ToolParser):
    name = "mistral"

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
            return Scan(content, found=True)  # no list: malformed
        calls, cut = object_calls(text, pos + 1, _HEAD, _KEYS, ",", "]")
        return Scan(content, calls, found=True, cut=cut)
