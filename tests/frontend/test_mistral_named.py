"""Mistral's named call format (tokenizer v11+): ``[TOOL_CALLS]name[ARGS]{...}``, the
pattern repeated per call, read whole and streamed by the ``mistral`` parser alongside
the list format."""

from __future__ import annotations

import random

import pytest

from radixlm.frontend.tool_parsers import ToolCall, make_tool_parser

from .test_tool_parsers import W_ARGS, WEATHER, _chunks, _stream

TEXT = f"Sure. [TOOL_CALLS]get_weather[ARGS]{W_ARGS}[TOOL_CALLS]get_time[ARGS]{{}}"
TIME = ToolCall("get_time", "{}")


def test_named_calls_parse_whole():
    parser = make_tool_parser("mistral")
    assert parser.parse(TEXT) == ("Sure.", [WEATHER, TIME])
    assert parser.parse('[TOOL_CALLS]f[ARGS] {"a": 1}') == (None, [ToolCall("f", '{"a": 1}')])
    # Text after the calls is dropped, as in the list format.
    assert parser.parse(TEXT + " done") == ("Sure.", [WEATHER, TIME])


@pytest.mark.parametrize("seed", range(8))
def test_named_calls_stream_like_the_whole_parse(seed):
    assert _stream("mistral", _chunks(TEXT, random.Random(seed)))[:2] == ("Sure.", [WEATHER, TIME])
    assert _stream("mistral", list(TEXT))[:2] == ("Sure.", [WEATHER, TIME])


def test_named_arguments_stream_in_pieces():
    stream = make_tool_parser("mistral").stream()
    frags = [f for ch in TEXT for f in stream.feed(ch).calls] + stream.finish().calls
    assert [f.name for f in frags if f.id is not None] == ["get_weather", "get_time"]
    assert len([f for f in frags if f.index == 0 and f.id is None]) == len(W_ARGS)


def test_every_prefix_keeps_markup_out_of_content():
    parser = make_tool_parser("mistral")
    for end in range(TEXT.index("get_weather") + 1, len(TEXT) + 1):
        prefix = TEXT[:end]
        got = parser.parse(prefix)
        assert got.content == "Sure.", prefix
        assert got.calls == [WEATHER, TIME][: len(got.calls)], prefix
        content, calls, _ = _stream("mistral", _chunks(prefix, random.Random(end)))
        assert content == "Sure."
        for s, full in zip(calls, [WEATHER, TIME]):
            assert s.name == full.name and full.arguments.startswith(s.arguments)


def test_cut_second_call_keeps_the_first():
    cut = TEXT[: TEXT.rindex("get_time") + 4]
    assert make_tool_parser("mistral").parse(cut) == ("Sure.", [WEATHER])


@pytest.mark.parametrize(
    "text", ["[TOOL_CALLS]f[ARGS]not json", "[TOOL_CALLS]f(x)", '[TOOL_CALLS]f[ARGS]{"a": tru}']
)
def test_malformed_named_calls_are_content(text):
    assert make_tool_parser("mistral").parse(text) == (text, [])
