"""Tool-call parsers of every family: complete parse, the same text streamed in random
chunkings, parallel calls, calls cut short, malformed markup, auto detection (no server)."""

from __future__ import annotations

import json
import random

import pytest

from radixlm.frontend.tool_calls import ToolChatFormat
from radixlm.frontend.tool_parsers import (
    TOOL_PARSERS,
    ToolCall,
    detect_tool_parser,
    make_tool_parser,
)
from radixlm.runtime.sched.finish import FinishReason

DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

WEATHER = ToolCall("get_weather", '{"city": "Pa\\"ris}", "n": [1, {"a": "]"}]}')
TIME = ToolCall("get_time", "{}")
W_ARGS = WEATHER.arguments


def _ds(name: str, args: str) -> str:
    return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"


# parser -> (text, content, calls): two parallel calls each, the second named get_time.
CASES = {
    "hermes": (
        "Let me check.\n<tool_call>\n"
        f'{{"name": "get_weather", "arguments": {W_ARGS}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.",
        [WEATHER, TIME],
    ),
    "llama3": (
        f'<|python_tag|>{{"name": "get_weather", "parameters": {W_ARGS}}}; '
        '{"name": "get_time", "parameters": {}}',
        None,
        [WEATHER, TIME],
    ),
    "mistral": (
        f'Sure. [TOOL_CALLS] [{{"name": "get_weather", "arguments": {W_ARGS}}}, '
        '{"name": "get_time", "arguments": {}}]',
        "Sure.",
        [WEATHER, TIME],
    ),
    "deepseek": (
        f"Sure.\n{DS_CALLS}{_ds('get_weather', W_ARGS)}\n{_ds('get_time', '{}')}{DS_CALLS_END}",
        "Sure.",
        [WEATHER, TIME],
    ),
    "pythonic": (
        ' [get_weather(city="Pa\\"ris]", n=[1, {"a": "]"}], ok=True, none=None), get_time()]',
        None,
        [
            ToolCall(
                "get_weather",
                '{"city": "Pa\\"ris]", "n": [1, {"a": "]"}], "ok": true, "none": null}',
            ),
            TIME,
        ],
    ),
}

# One call alone, in each family's other accepted shape.
SINGLE = {
    "hermes": ('<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>', None),
    "llama3": ('  {"name": "f", "arguments": {"a": 1}}', None),
    "mistral": ('[TOOL_CALLS][{"arguments": {"a": 1}, "name": "f"}]', None),
    "deepseek": (f'x{DS_CALL}f{DS_SEP}{{"a": 1}}{DS_CALL_END}', "x"),  # DeepSeek-V3.1
    "pythonic": ("[f(a=1)]", None),
}

# Markup that holds no call: the whole text is the content.
MALFORMED = {
    "hermes": ["x <tool_call> not json </tool_call>", '<tool_call>{"name": 3}</tool_call>'],
    "llama3": ['{"name": 5, "parameters": {}}', '<|python_tag|>print("hi")'],
    "mistral": ['[TOOL_CALLS] [{"nam": "f"}]', "[TOOL_CALLS] f(x)"],
    "deepseek": [f"{DS_CALLS}{DS_CALL}junk{DS_CALL_END}{DS_CALLS_END}"],
    "pythonic": [
        "[f(1, 2)]",
        '[__import__("os").system("echo hi")]',
        "[f(a=g())]",
        "[f(**kw)]",
    ],
}


def _chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _stream(name: str, pieces: list[str]) -> tuple[str, list[ToolCall], list]:
    """(content, calls, first fragments) from streaming `pieces`."""
    stream = make_tool_parser(name).stream()
    deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
    content = "".join(d.content for d in deltas)
    frags = [c for d in deltas for c in d.calls]
    firsts = [f for f in frags if f.id is not None]
    assert [f.index for f in firsts] == list(range(len(firsts)))
    assert all(f.id.startswith("call_") and not f.arguments for f in firsts)
    assert len({f.id for f in firsts}) == len(firsts)
    calls = [
        ToolCall(f.name, "".join(g.arguments for g in frags if g.index == f.index)) for f in firsts
    ]
    return content, calls, firsts


@pytest.mark.parametrize("name", sorted(CASES))
def test_complete_parse(name):
    text, content, calls = CASES[name]
    parsed = make_tool_parser(name).parse(text)
    assert parsed == (content, calls)
    for call in parsed.calls:
        json.loads(call.arguments)
    single, single_content = SINGLE[name]
    assert make_tool_parser(name).parse(single) == (single_content, [ToolCall("f", '{"a": 1}')])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", range(8))
def test_stream_equals_complete_parse(name, seed):
    text, content, calls = CASES[name]
    got_content, got_calls, _ = _stream(name, _chunks(text, random.Random(seed)))
    assert (got_content, got_calls) == (content or "", calls)
    assert _stream(name, list(text))[:2] == (content or "", calls)  # one character a time


@pytest.mark.parametrize("name", sorted(CASES))
def test_json_arguments_stream_in_pieces(name):
    """JSON-argument families send a call's arguments as they are written; pythonic sends
    each call whole once its element closes."""
    text, _, _ = CASES[name]
    stream = make_tool_parser(name).stream()
    frags = [f for ch in text for f in stream.feed(ch).calls] + stream.finish().calls
    weather = [f for f in frags if f.index == 0 and f.id is None]
    assert len(weather) == (1 if name == "pythonic" else len(W_ARGS))


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_text_is_content(name):
    text = "Hello <b>[there]</b> {not a call} <tool friend \n"
    parser = make_tool_parser(name)
    assert parser.parse(text) == (text, [])
    assert _stream(name, _chunks(text, random.Random(1)))[:2] == (text, [])


@pytest.mark.parametrize("name", sorted(CASES))
def test_cut_second_call_keeps_the_first_and_drops_the_markup(name):
    text, content, calls = CASES[name]
    cut = text[: text.rindex("get_time") + 4]
    parser = make_tool_parser(name)
    assert parser.parse(cut) == (content, calls[:1])
    # Streamed, the first call is whole and nothing of the markup reaches the content.
    got_content, got_calls, _ = _stream(name, _chunks(cut, random.Random(2)))
    assert got_content == (content or "") and got_calls[0] == calls[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_prefix_parses_without_markup_in_content(name):
    """Cut anywhere after the first call's name (the markup is recognisable): content is
    the text before the markup, calls are complete ones of the full parse, and a stream
    of the prefix agrees with its parse up to one started call."""
    text, content, calls = CASES[name]
    parser = make_tool_parser(name)
    start = text.index("get_weather") + len("get_weather")
    for end in range(start + 1, len(text) + 1):
        prefix = text[:end]
        got = parser.parse(prefix)
        assert got.content == content, prefix
        assert got.calls == calls[: len(got.calls)], prefix
        s_content, s_calls, _ = _stream(name, _chunks(prefix, random.Random(end)))
        assert s_content == (content or "")
        assert s_calls[: len(got.calls)] == got.calls
        assert len(s_calls) <= len(got.calls) + 1
        for s, full in zip(s_calls, calls):
            assert s.name == full.name and full.arguments.startswith(s.arguments)


@pytest.mark.parametrize("name, text", [(n, t) for n in MALFORMED for t in MALFORMED[n]])
def test_malformed_markup_is_content(name, text):
    assert make_tool_parser(name).parse(text) == (text, [])
    assert _stream(name, _chunks(text, random.Random(3)))[:2] == (text, [])


@pytest.mark.parametrize(
    "name, text",
    [
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>'),
        ("deepseek", f"{DS_CALLS}{_ds('f', '{bad}')}{DS_CALLS_END}"),
        ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": tru}}]'),
    ],
)
def test_malformed_arguments_after_a_streamed_name(name, text):
    """Parsed whole: the text is the content. Streamed: the call's name and arguments
    were sent before they turned out malformed (fragments cannot be taken back), and
    no markup reaches the content."""
    assert make_tool_parser(name).parse(text) == (text, [])
    content, calls, _ = _stream(name, _chunks(text, random.Random(4)))
    assert content == "" and [c.name for c in calls] == ["f"]


def test_hermes_call_cut_alone_leaves_no_content_and_no_call():
    text = 'Hi.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    assert make_tool_parser("hermes").parse(text) == ("Hi.", [])
    parser = make_tool_parser("hermes")
    assert parser.parse(text[:9], cut=True) == ("Hi.", [])  # cut inside the tag
    assert parser.parse(text[:9]) == (text[:9], [])  # plain text that ends so
    assert parser.parse("Hi. ", cut=True) == ("Hi. ", [])
    starts = {"hermes": "<", "llama3": "<", "mistral": "[", "deepseek": "<", "pythonic": "["}
    for name, first in starts.items():  # cut after the markup's first character
        text, content, _ = CASES[name]
        cut = text[: text.index(first) + 1]
        assert make_tool_parser(name).parse(cut, cut=True).content == content
        assert make_tool_parser(name).parse(cut).content == cut


def _format_stream(fmt: ToolChatFormat, text: str, reason: str, step: int = 5) -> list[dict]:
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    out = []
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        out += fmt.deltas(0, {"text": piece, "finish_reason": reason if last else None}, False)
    return [c["choices"][0] for c in out]


def test_chat_format_cut_call_finishes_with_length():
    text, _, _ = CASES["hermes"]
    cut = text[: text.rindex("get_time") + 4]
    fmt = ToolChatFormat("chatcmpl-1", 0, "m")
    full = fmt.full_choice(0, {"text": cut, "finish_reason": FinishReason.LENGTH})
    assert full["finish_reason"] == "length"
    assert full["message"]["content"] == "Let me check."
    assert [c["function"]["name"] for c in full["message"]["tool_calls"]] == ["get_weather"]
    assert full["message"]["tool_calls"][0]["function"]["arguments"] == W_ARGS
    choices = _format_stream(fmt, cut, FinishReason.LENGTH)
    assert choices[-1]["finish_reason"] == "length"
    content = "".join(c["delta"].get("content") or "" for c in choices)
    assert content == "Let me check."
    alone = fmt.full_choice(1, {"text": cut[:40], "finish_reason": FinishReason.LENGTH})
    assert alone["message"]["content"] == "Let me check." and "tool_calls" not in alone["message"]


def test_chat_format_malformed_keeps_text_and_reason():
    fmt = ToolChatFormat("chatcmpl-1", 0, "m", tool_parser=make_tool_parser("mistral"))
    bad = '[TOOL_CALLS] [{"nam": "f"}]'
    full = fmt.full_choice(0, {"text": bad, "finish_reason": FinishReason.STOP})
    assert full["message"]["content"] == bad and full["finish_reason"] == "stop"
    assert "tool_calls" not in full["message"]
    choices = _format_stream(fmt, bad, FinishReason.STOP, step=3)
    assert "".join(c["delta"].get("content") or "" for c in choices) == bad
    assert choices[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize("name", sorted(CASES))
def test_chat_format_stream_and_full_agree(name):
    text, content, calls = CASES[name]
    fmt = ToolChatFormat("chatcmpl-1", 0, "m", tool_parser=make_tool_parser(name))
    full = fmt.full_choice(0, {"text": text, "finish_reason": FinishReason.STOP})
    assert full["finish_reason"] == "tool_calls" and full["message"]["content"] == content
    assert [
        (c["function"]["name"], c["function"]["arguments"]) for c in full["message"]["tool_calls"]
    ] == [(c.name, c.arguments) for c in calls]
    choices = _format_stream(fmt, text, FinishReason.STOP, step=4)
    assert choices[-1]["finish_reason"] == "tool_calls"
    frags = [f for c in choices for f in c["delta"].get("tool_calls", [])]
    for i, call in enumerate(calls):
        assert "".join(f["function"]["arguments"] for f in frags if f["index"] == i) == (
            call.arguments
        )


@pytest.mark.parametrize(
    "template, name",
    [
        ("{% for t in tools %}<tool_call>{{ t }}</tool_call>{% endfor %}", "hermes"),
        ("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}", "mistral"),
        ("{{'<｜tool▁calls▁begin｜>'}}", "deepseek"),
        ("{{- '<|python_tag|>' + tool_call.name }}", "llama3"),
        ("Given the following functions, please respond with a JSON for a function call", "llama3"),
        ("[func_name1(params_name1=params_value1, params_name2=params_value2...)]", "pythonic"),
        ({"default": "x", "tool_use": "<tool_call>"}, "hermes"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes"),
        (None, "hermes"),
    ],
)
def test_detect_from_chat_template(template, name):
    assert detect_tool_parser(template) == name

    class Tok:
        chat_template = template

    assert make_tool_parser("auto", Tok()).name == name


def test_registry_matches_the_flag():
    from radixlm.config import ServerArgs

    field = ServerArgs.__dataclass_fields__["tool_call_parser"]
    assert field.metadata["choices"] == ["auto", *TOOL_PARSERS]
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'"):
        make_tool_parser("nope")


def test_output_parser_is_hermes_only_when_taught():
    """A forced call is written in the configured parser's format (its forcing grammar);
    Hermes is the parser only where the prompt teaches Hermes (no native tools, auto)."""
    from radixlm.frontend.tool_calls import output_tool_parser
    from radixlm.frontend.tool_prompt import ToolSetup

    tool = {"type": "function", "function": {"name": "f"}}
    mistral = make_tool_parser("mistral")
    auto = ToolSetup.from_request([tool], "auto", None)
    forced = ToolSetup.from_request([tool], "required", None)
    assert output_tool_parser(mistral, auto, native_tools=True) is mistral
    assert output_tool_parser(mistral, auto, native_tools=False).name == "hermes"
    assert output_tool_parser(mistral, forced, native_tools=True) is mistral
    assert output_tool_parser(mistral, forced, native_tools=False) is mistral
    assert output_tool_parser(mistral, ToolSetup.from_request(None, None, None), True) is None


def test_auto_on_the_bundled_model_is_hermes(tokenizer):
    """SmolLM2's template renders no tools: auto keeps today's Hermes convention."""
    assert make_tool_parser("auto", tokenizer).name == "hermes"
