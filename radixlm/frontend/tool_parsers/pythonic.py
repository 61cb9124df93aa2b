"""Pythonic calls (Llama 3.2 / Llama 4 style): ``[get_weather(city="Paris"), get_time()]``.

The output is a Python list of calls, at its start (leading whitespace allowed); an
output that starts otherwise is plain content. Each element is parsed with `ast` (never
evaluated): a call of a (dotted) name with keyword arguments whose values are Python
literals (`ast.literal_eval`), given as the JSON object of those arguments. Calls
stream one whole call at a time, as each element of the list closes. Text after the
list is dropped.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from radixlm.frontend.tool_parsers.base import Scan, ToolCall, ToolParser, calls_format
from radixlm.frontend.tool_parsers.pythonic_grammar import keyword_arguments_ebnf

_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_MAY_START = re.compile(r"(\[\s*([A-Za-z_][\w.]*\s*)?)?")


def _elements(text: str, pos: int) -> tuple[list[str], bool]:
    """The complete top-level elements of the list whose ``[`` is at `pos - 1`, and
    whether its ``]`` was reached (Python strings with quotes and escapes are skipped)."""
    out, depth, quote, escaped, start = [], 0, "", False, pos
    for i in range(pos, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")}" or (ch == "]" and depth > 0):
            depth -= 1
        elif depth == 0 and ch in ",]":
            if text[start:i].strip():
                out.append(text[start:i])
            if ch == "]":
                return out, True
            start = i + 1
    return out, False


def _call(element: str) -> ToolCall | None:
    """The call one element writes, or None when it is no keyword-only literal call."""
    try:
        node = ast.parse(element.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or node.args:
        return None
    try:
        name = ast.unparse(node.func)
        if not re.fullmatch(r"[A-Za-z_][\w.]*", name) or any(k.arg is None for k in node.keywords):
            return None
        args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        return ToolCall(name, json.dumps(args, ensure_ascii=False))
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


class PythonicParser(ToolParser):
    name = "pythonic"

    def forced_format(self, tools: list[tuple[str, dict[str, Any]]], parallel: bool) -> dict:
        """``[name(key=value, ...), ...]`` with keyword arguments from each tool's
        schema (`pythonic_grammar`)."""
        tags = [
            {
                "type": "tag",
                "begin": f"{name}(",
                "content": {"type": "grammar", "grammar": keyword_arguments_ebnf(schema)},
                "end": ")",
            }
            for name, schema in tools
        ]
        return calls_format(tags, ", ", parallel, ("[", "]"))

    def scan(self, text: str, final: bool) -> Scan:
        stripped = text.lstrip()
        if not _START.match(stripped):
            if not final and _MAY_START.fullmatch(stripped):
                return Scan("")  # may still become a call list
            return Scan(text if final else text.rstrip())
        elements, closed = _elements(text, len(text) - len(stripped) + 1)
        calls = []
        for element in elements:
            call = _call(element)
            if call is None:
                return Scan("", calls, found=True)
            calls.append(call)
        return Scan("", calls, found=True, cut=not closed)
