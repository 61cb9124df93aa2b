"""Llama 3.1 / 3.2 JSON calls: ``{"name": ..., "parameters": {...}}``.

The output is one JSON call object, or several separated by ``;``, either at the start
of the output (leading whitespace allowed) or after ``<|python_tag|>`` (then the text
before the tag is content). ``arguments`` is read as well as ``parameters``. An output
that starts with anything else is plain content (Meta's templates ask for the call and
nothing else; vLLM's ``llama3_json`` parser reads the same shapes).
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.frontend.tool_parsers.base import Scan, ToolParser, call_tag, calls_format, held_back
from radixlm.frontend.tool_parsers.json_objects import head_pattern, object_calls

PYTHON_TAG = "<|python_tag|>"
_KEYS = ("parameters", "arguments")
_HEAD = head_pattern(_KEYS)
_START = re.compile(r'\{\s*"name"\s*:')
_MAY_START = re.compile(r'\{\s*("(n(a(m(e("\s*)?)?)?)?)?)?')


class Llama3Parser(ToolParser):
    name = "llama3"

    def forced_format(self, tools: list[tuple[str, dict[str, Any]]], parallel: bool) -> dict:
        """``{"name": ..., "parameters": {...}}`` objects joined by ``; ``."""
        tags = [call_tag(f'{{"name": {json.dumps(n)}, "parameters": ', s, "}") for n, s in tools]
        return calls_format(tags, "; ", parallel)

    def scan(self, text: str, final: bool) -> Scan:
        tag = text.find(PYTHON_TAG)
        stripped = text.lstrip()
        if tag >= 0:
            content, pos = text[:tag].rstrip(), tag + len(PYTHON_TAG)
        elif _START.match(stripped):
            content, pos = "", len(text) - len(stripped)
        elif not final and _MAY_START.fullmatch(stripped):
            return Scan("")  # may still become a call
        elif final:
            return Scan(text)
        else:
            return Scan(text[: len(text) - held_back(text, (PYTHON_TAG,))].rstrip())
        calls, cut = object_calls(text, pos, _HEAD, _KEYS, ";")
        return Scan(content, calls, found=True, cut=cut)
