"""Tool-call parsers per model family, chosen by ``--tool-call-parser``.

Use::

    parser = make_tool_parser(name, tokenizer)   # name: "auto" or one of TOOL_PARSERS
    content, calls = parser.parse(text)           # calls: list[ToolCall(name, arguments)]
    stream = parser.stream()
    delta = stream.feed(text_delta)               # Delta(content, calls: list[CallDelta])
    delta = stream.finish()

See `base.py` for the semantics (cut and malformed calls, streaming invariant).
"""

from __future__ import annotations

from typing import Any

from radixlm.frontend.tool_parsers.base import (
    CallDelta,
    Delta,
    Parsed,
    ToolCall,
    ToolParser,
    ToolStream,
    new_call_id,
)
from radixlm.frontend.tool_parsers.deepseek import CALLS_BEGIN, DeepSeekParser
from radixlm.frontend.tool_parsers.hermes import CALL_START, HermesParser
from radixlm.frontend.tool_parsers.llama3 import PYTHON_TAG, Llama3Parser
from radixlm.frontend.tool_parsers.mistral import ARGS, TOOL_CALLS, MistralParser
from radixlm.frontend.tool_parsers.pythonic import PythonicParser

__all__ = [
    "TOOL_PARSERS",
    "CallDelta",
    "Delta",
    "Parsed",
    "ToolCall",
    "ToolParser",
    "ToolStream",
    "detect_tool_parser",
    "make_tool_parser",
    "new_call_id",
]

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3Parser, MistralParser, DeepSeekParser, PythonicParser)
}

# (marker in the chat template source, parser), first match wins. Pythonic templates
# (Llama 3.2 / 4) show a ``[func_name1(params_name1=...`` example; Llama 3.1's JSON
# template names <|python_tag|> or asks for "a JSON for a function call".
_MARKERS = (
    (CALL_START, "hermes"),
    (TOOL_CALLS, "mistral"),
    (CALLS_BEGIN, "deepseek"),
    ("[func_name1(", "pythonic"),
    (PYTHON_TAG, "llama3"),
    ("JSON for a function call", "llama3"),
)


def detect_tool_parser(template: Any) -> str:
    """The parser for a chat template's source (str, or a dict of named templates):
    the first of `_MARKERS` found; ``hermes`` (the convention radixlm teaches a template
    without tools) when none is."""
    for marker, name in _MARKERS:
        if marker in _template_source(template):
            return name
    return "hermes"


def make_tool_parser(name: str, tokenizer: Any = None) -> ToolParser:
    """A parser by name; ``auto`` detects it from ``tokenizer.chat_template``.
    Raises ValueError for an unknown name."""
    if name == "auto":
        name = detect_tool_parser(getattr(tokenizer, "chat_template", None))
    if name not in TOOL_PARSERS:
        known = ", ".join(TOOL_PARSERS)
        raise ValueError(f"unknown tool-call parser {name!r}; use auto or one of {known}")
    if name == "mistral":  # which of Mistral's formats forced calls are written in
        template = getattr(tokenizer, "chat_template", None)
        return MistralParser(named=ARGS in _template_source(template))
    return TOOL_PARSERS[name]()


def _template_source(template: Any) -> str:
    """A chat template's source text (a dict of named templates joined; "" when None)."""
    if isinstance(template, dict):
        return " ".join(str(t) for t in template.values())
    return template or ""
