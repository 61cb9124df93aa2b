"""Forced tool calls in each parser's own convention: the forcing grammar
(`ToolParser.forced_format` via `ToolSetup.grammar`) accepts the parser's native markup
(not Hermes markup), and what it accepts parses back to the intended calls."""

from __future__ import annotations

import pytest
import xgrammar as xgr

from radixlm.frontend.tool_parsers import TOOL_PARSERS, ToolCall, make_tool_parser
from radixlm.frontend.tool_parsers.mistral import MistralParser
from radixlm.frontend.tool_prompt import ToolSetup
from radixlm.runtime.sampling.grammar import GrammarCompiler

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
DS = {
    "begin": "<｜tool▁calls▁begin｜>",
    "call": "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
    "end": "```<｜tool▁call▁end｜>",
}

# parser -> (one call of get_weather, two calls: get_weather then get_time)
NATIVE = {
    "hermes": (
        HERMES_CALL,
        HERMES_CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    ),
    "llama3": (
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        '{"name": "get_weather", "parameters": {"city": "Rome"}}; '
        '{"name": "get_time", "parameters": {}}',
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "get_time", "arguments": {}}]',
    ),
    "mistral-named": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]get_time[ARGS]{}',
    ),
    "deepseek": (
        f'{DS["begin"]}{DS["call"]}get_weather\n```json\n{{"city": "Rome"}}\n{DS["end"]}'
        "<｜tool▁calls▁end｜>",
        f'{DS["begin"]}{DS["call"]}get_weather\n```json\n{{"city": "Rome"}}\n{DS["end"]}\n'
        f"{DS['call']}get_time\n```json\n{{}}\n{DS['end']}<｜tool▁calls▁end｜>",
    ),
    "pythonic": ('[get_weather(city="Rome")]', '[get_weather(city="Rome"), get_time()]'),
}
ROME = ToolCall("get_weather", '{"city": "Rome"}')


def _parser(name: str):
    return MistralParser(named=True) if name == "mistral-named" else make_tool_parser(name)


@pytest.fixture(scope="module")
def compiler():
    info = xgr.TokenizerInfo(["<eos>", "a"], vocab_size=2, stop_token_ids=[0])
    return GrammarCompiler(None, 2, [0], tokenizer_info=info)


def _accepts(compiler, name: str, choice, parallel: bool, text: str) -> bool:
    """Whether the forcing grammar accepts `text` as a whole output (then end of output)."""
    spec = ToolSetup.from_request([WEATHER, TIME], choice, parallel).grammar(_parser(name))
    matcher = xgr.GrammarMatcher(compiler.compile("structural_tag", spec))
    return matcher.accept_string(text) and matcher.accept_token(0) and matcher.is_terminated()


def test_every_parser_has_a_case():
    assert set(TOOL_PARSERS) | {"mistral-named"} == set(NATIVE)


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_forced_grammar_writes_the_native_format(compiler, name):
    one, two = NATIVE[name]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        assert _accepts(compiler, name, choice, False, one)
        assert _parser(name).parse(one) == (None, [ROME])
    assert not _accepts(compiler, name, named, False, two)  # get_time not allowed
    assert not _accepts(compiler, name, "required", False, two)  # one call only
    assert _accepts(compiler, name, "required", True, two)
    assert _parser(name).parse(two) == (None, [ROME, ToolCall("get_time", "{}")])
    if name != "hermes":
        assert not _accepts(compiler, name, "required", True, HERMES_CALL)


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_forced_grammar_checks_the_arguments(compiler, name):
    """The city is required: a call without it is refused in every format."""
    no_city = NATIVE[name][0].replace('"city": "Rome"', "").replace('city="Rome"', "")
    assert no_city != NATIVE[name][0]
    assert not _accepts(compiler, name, "required", False, no_city)


@pytest.mark.parametrize(
    "text, ok, arguments",
    [
        (
            '[get_weather(city="Rome", unit="f", days=3)]',
            True,
            {"city": "Rome", "unit": "f", "days": 3},
        ),
        ('[get_weather(city="Rome", days=-2)]', True, {"city": "Rome", "days": -2}),
        ('[get_weather(city="Rome", unit="k")]', False, None),  # not in the enum
        ('[get_weather(city="Rome", days="3")]', False, None),  # not an integer
        ('[get_weather(days=3, city="Rome")]', False, None),  # declared order
        ('[get_weather(city="Rome" , days=3)]', False, None),
    ],
)
def test_pythonic_keyword_arguments(compiler, text, ok, arguments):
    import json

    assert _accepts(compiler, "pythonic", "required", False, text) is ok
    if ok:
        (call,) = make_tool_parser("pythonic").parse(text).calls
        assert (call.name, json.loads(call.arguments)) == ("get_weather", arguments)


def test_mistral_format_follows_the_template():
    class Tok:
        def __init__(self, template):
            self.chat_template = template

    assert make_tool_parser("mistral", Tok("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}")).named
    assert not make_tool_parser("mistral", Tok("{{ '[TOOL_CALLS]' + calls }}")).named
    assert not make_tool_parser("mistral").named
