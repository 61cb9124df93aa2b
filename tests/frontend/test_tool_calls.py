"""Tool-call parser, streamed fragments, tool validation and rendering (no server)."""

from __future__ import annotations

import json

import pytest

from radixlm.frontend.errors import APIError
from radixlm.frontend.tool_calls import (
    ToolCall,
    ToolCallStream,
    ToolChatFormat,
    parse_tool_calls,
)
from radixlm.frontend.tool_prompt import ToolSetup, render_chat

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}

TWO_CALLS = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "n": [1, {"a": "]"}]}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"arguments": {"tz": "UTC"}, "name": "get_time"}\n'  # not streamable: parsed when closed
    "</tool_call>"
)


def test_parse_two_calls():
    parsed = parse_tool_calls(TWO_CALLS)
    assert parsed.content == "Let me check."
    assert parsed.calls == [
        ToolCall("get_weather", '{"city": "Pa\\"ris}", "n": [1, {"a": "]"}]}'),
        ToolCall("get_time", '{"tz": "UTC"}'),
    ]
    json.loads(parsed.calls[0].arguments)


@pytest.mark.parametrize(
    "text, content, calls",
    [
        ("plain answer  ", "plain answer  ", []),
        ("x <tool_call> not json </tool_call>", "x <tool_call> not json </tool_call>", []),
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', None, [ToolCall("f", "{}")]),
        (
            '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>',
            None,
            [ToolCall("f", '{"a": 1}')],
        ),
        ('<tool_call>\n{"name": "f", "arguments": {"a": "tru', None, [ToolCall("f", '{"a": "tru')]),
    ],
)
def test_parse_cases(text, content, calls):
    parsed = parse_tool_calls(text)
    assert (parsed.content, parsed.calls) == (content, calls)


def _stream(text: str, step: int) -> tuple[str, list[dict]]:
    stream, content, frags = ToolCallStream(), "", []
    for i in range(0, len(text), step):
        c, f = stream.feed(text[i : i + step], final=i + step >= len(text))
        content += c
        frags += f
    return content, frags


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 1000])
def test_stream_fragments_concatenate_to_full_parse(step):
    full = parse_tool_calls(TWO_CALLS)
    content, frags = _stream(TWO_CALLS, step)
    assert content == full.content
    firsts = [f for f in frags if "id" in f]
    assert [f["index"] for f in firsts] == [0, 1]
    assert [f["function"]["name"] for f in firsts] == ["get_weather", "get_time"]
    assert all(f["id"].startswith("call_") and f["type"] == "function" for f in firsts)
    for i, call in enumerate(full.calls):
        pieces = [f["function"]["arguments"] for f in frags if f["index"] == i]
        assert "".join(pieces) == call.arguments
    # The first call's arguments stream in several pieces, after its name.
    weather = [f for f in frags if f["index"] == 0]
    assert "id" in weather[0] and (step > 100 or len(weather) > 2)


@pytest.mark.parametrize("step", [1, 4])
def test_stream_plain_text_is_all_content(step):
    text = "Hello <b>there</b> <tool friend \n"
    assert _stream(text, step) == (text, [])


def test_tool_chat_format_stream_and_full_agree():
    fmt = ToolChatFormat("chatcmpl-1", 0, "m")
    chunks = []
    pieces = [TWO_CALLS[i : i + 7] for i in range(0, len(TWO_CALLS), 7)]
    for k, piece in enumerate(pieces):
        reason = "stop" if k == len(pieces) - 1 else None
        chunks += fmt.deltas(0, {"text": piece, "finish_reason": reason}, False)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == "Let me check."
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    full = fmt.full_choice(0, {"text": TWO_CALLS, "finish_reason": "stop"})
    assert full["finish_reason"] == "tool_calls"
    calls = full["message"]["tool_calls"]
    streamed = [f for d in deltas for f in d.get("tool_calls", [])]
    for i, call in enumerate(calls):
        args = "".join(f["function"]["arguments"] for f in streamed if f["index"] == i)
        assert args == call["function"]["arguments"]
    plain = fmt.full_choice(1, {"text": "no tools", "finish_reason": "length"})
    assert plain["message"]["content"] == "no tools" and "tool_calls" not in plain["message"]
    assert plain["finish_reason"] == "length"


# ---- validation, grammar, rendering ---------------------------------------------------


def test_setup_modes():
    auto = ToolSetup.from_request([WEATHER, TIME], "auto", None)
    assert auto.active and auto.forced is None
    triggered = json.loads(auto.grammar())["format"]
    assert triggered["type"] == "triggered_tags" and triggered["triggers"] == ["<tool_call>"]
    assert [t["content"]["json_schema"] for t in triggered["tags"]] == [
        WEATHER["function"]["parameters"],
        {"type": "object"},
    ]
    assert ToolSetup.from_request([WEATHER, TIME], None, None).forced is None
    none = ToolSetup.from_request([WEATHER], "none", None)
    assert not none.active and none.grammar() is None
    assert ToolSetup.from_request([WEATHER, TIME], "required", None).forced == [
        "get_weather",
        "get_time",
    ]
    named = ToolSetup.from_request(
        [WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, False
    )
    tag = json.loads(named.grammar())
    assert tag["format"]["stop_after_first"] is True
    (only,) = tag["format"]["tags"]
    assert only["begin"] == '<tool_call>\n{"name": "get_time", "arguments": '
    assert only["content"]["json_schema"] == {"type": "object"}
    parallel = ToolSetup.from_request([WEATHER], "required", True)
    assert json.loads(parallel.grammar())["format"]["stop_after_first"] is False


@pytest.mark.parametrize(
    "tools, choice, param, message",
    [
        (None, "required", "tool_choice", "only allowed when 'tools'"),
        ([], "required", "tool_choice", "needs a non-empty 'tools'"),
        (
            [WEATHER],
            {"type": "function", "function": {"name": "nope"}},
            "tool_choice",
            "not in 'tools'",
        ),
        ([WEATHER], {"type": "function"}, "tool_choice", "must be 'none', 'auto'"),
        ([WEATHER], "always", "tool_choice", "is invalid"),
        ([{"type": "retrieval"}], "auto", "tools.0", "invalid tool at tools.0.function"),
        ([{"type": "web", "function": {"name": "f"}}], "auto", "tools.0.type", "only 'function'"),
        ([{"type": "function", "function": {"name": "a b"}}], "auto", "tools.0", "pattern"),
        ([WEATHER, WEATHER], "auto", "tools", "unique"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": 1}}}],
            "auto",
            "tools.0.function.parameters",
            "parameters is not a valid JSON schema",
        ),
    ],
)
def test_setup_errors(tools, choice, param, message):
    with pytest.raises(APIError) as err:
        ToolSetup.from_request(tools, choice, None)
    assert err.value.status == 400 and err.value.param == param
    assert message in err.value.message


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    {"role": "tool", "content": "22 C", "tool_call_id": "call_1"},
]


def test_render_fallback_puts_tools_in_system_and_calls_in_text():
    setup = ToolSetup.from_request([WEATHER], "auto", None)
    msgs, extra = render_chat(HISTORY, setup, native=False)
    assert extra == {}
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER) in msgs[0]["content"]
    assert msgs[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert msgs[3]["content"] == (
        "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22 C\n</tool_response>"
    )
    none = ToolSetup.from_request([WEATHER], "none", None)
    msgs, _ = render_chat(HISTORY[1:2], none, native=False)
    assert msgs == [{"role": "user", "content": "Weather in Paris?"}]


def test_render_native_passes_tools_and_dict_arguments():
    setup = ToolSetup.from_request([WEATHER], "auto", None)
    msgs, extra = render_chat(HISTORY, setup, native=True)
    assert extra == {"tools": [WEATHER]}
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert msgs[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


def test_tool_grammars_constrain_calls():
    """auto: free text, but a started call must name a tool and match its parameters;
    required: nothing but calls."""
    import xgrammar as xgr

    from radixlm.runtime.sampling.grammar import GrammarCompiler

    info = xgr.TokenizerInfo(["<eos>", "a"], vocab_size=2, stop_token_ids=[0])
    compiler = GrammarCompiler(None, 2, [0], tokenizer_info=info)

    def matcher(choice):
        spec = ToolSetup.from_request([WEATHER, TIME], choice, None).grammar()
        return xgr.GrammarMatcher(compiler.compile("structural_tag", spec))

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert matcher("auto").accept_string("Let me look that up. " + call)
    assert matcher("auto").accept_string("No call at all.")
    started = matcher("auto")
    assert started.accept_string("Sure. <tool_call>\n")
    assert not started.accept_string('{"name": "bogus"')
    assert not started.accept_string('{"name": "get_weather", "arguments": {}')  # city missing
    assert matcher("required").accept_string(call)
    assert not matcher("required").accept_string("Sure. ")


def test_rendered_chars_counts_tools_and_arguments():
    from radixlm.frontend.chat_template import rendered_chars

    setup = ToolSetup.from_request([WEATHER], "auto", None)
    contents = sum(len(m["content"]) for m in HISTORY)
    args = len('{"city": "Paris"}')
    assert rendered_chars(HISTORY, setup) == contents + args + len(json.dumps([WEATHER]))
    none = ToolSetup.from_request([WEATHER], "none", None)
    assert rendered_chars(HISTORY, none) == contents + args
