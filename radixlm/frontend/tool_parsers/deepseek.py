"""DeepSeek-V3 calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

one ``<｜tool▁call▁begin｜>`` block per call. DeepSeek-V3.1's shorter block
``<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>`` is
read too. Content is the text before the first marker (trailing whitespace removed);
text after the calls is dropped. Source: DeepSeek-V3's chat template, as SGLang's
``deepseekv3`` detector reads it.
"""

from __future__ import annotations

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

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_V3_HEAD = re.compile(rf"\s*function{SEP}([^\n]+)\n```(?:json)?\n")
_V31_HEAD = re.compile(rf"\s*([^\s<]+){SEP}\s*(?=[{{\[])")


def _block_call(body: str) -> ToolCall | None:
    """The call of one block body (text up to its end marker or the end of the text);
    None until its name and the start of its JSON arguments are known (for good, in a
    closed body: malformed)."""
    head = _V3_HEAD.match(body) or _V31_HEAD.match(body)
    if head is None or head.end() == len(body) or body[head.end()] not in "{[":
        return None
    start = head.end()
    end = json_value_end(body, start)
    return ToolCall(head.group(1).strip(), body[start:end], complete=end is not None)


class DeepSeekParser(ToolParser):
    name = "deepseek"

    def forced_format(self, tools: list[tuple[str, dict[str, Any]]], parallel: bool) -> dict:
        """DeepSeek-V3 blocks (``function<｜tool▁sep｜>name`` and a fenced JSON object)
        joined by newlines, inside ``<｜tool▁calls▁begin｜>`` ... ``<｜tool▁calls▁end｜>``."""
        tags = [
            call_tag(f"{CALL_BEGIN}function{SEP}{n}\n```json\n", s, f"\n```{CALL_END}")
            for n, s in tools
        ]
        return calls_format(tags, "\n", parallel, (CALLS_BEGIN, CALLS_END))

    def scan(self, text: str, final: bool) -> Scan:
        starts = [i for i in (text.find(CALLS_BEGIN), text.find(CALL_BEGIN)) if i >= 0]
        if not starts:
            if final:
                return Scan(text)
            keep = len(text) - held_back(text, (CALLS_BEGIN, CALL_BEGIN))
            return Scan(text[:keep].rstrip())
        first = min(starts)
        section = text[first:].split(CALLS_END, 1)[0]
        blocks = section.split(CALL_BEGIN)[1:]
        calls = []
        for block in blocks:
            call = _block_call(block.split(CALL_END, 1)[0])
            if call is None:
                break
            calls.append(call)
        cut = CALLS_END not in text[first:] and (not blocks or CALL_END not in blocks[-1])
        return Scan(text[:first].rstrip(), calls, found=True, cut=cut)
