"""Tool calling over HTTP with the real `openai` client: required and named choices,
streamed fragments, a two-turn conversation, and refusals.

The bundled 135M model is weak: the tests check structure and validity, not content.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from .conftest import MODEL

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 32},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 32}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a timezone",
            "parameters": TIME_PARAMS,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def _chat(client, messages, **kw):
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, temperature=0, **kw
    )


def _check_call(call, name: str | None = None) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in SCHEMAS
    if name is not None:
        assert call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_required_choice_calls_a_valid_tool(client):
    resp = _chat(client, QUESTION, tool_choice="required")
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    _check_call(call)


def test_named_choice_calls_that_tool(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    resp = _chat(client, QUESTION, tool_choice=named)
    (call,) = resp.choices[0].message.tool_calls
    _check_call(call, "get_time")
    assert resp.choices[0].finish_reason == "tool_calls"


def test_parallel_calls_when_allowed(client):
    resp = _chat(client, QUESTION, tool_choice="required", parallel_tool_calls=True, max_tokens=200)
    calls = resp.choices[0].message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    if resp.choices[0].finish_reason == "tool_calls":  # else cut by max_tokens mid-call
        for call in calls:
            _check_call(call)


def test_streamed_fragments_concatenate_to_arguments(client):
    full = _chat(client, QUESTION, tool_choice="required").choices[0].message.tool_calls[0]
    chunks = list(_chat(client, QUESTION, tool_choice="required", stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    frags = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert frags[0].index == 0 and frags[0].id.startswith("call_")
    assert frags[0].function.name == full.function.name
    assert all(f.index == 0 and f.id is None for f in frags[1:])
    assert len(frags) > 2  # the arguments arrive in several pieces
    assert "".join(f.function.arguments or "" for f in frags) == full.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


def test_two_turn_conversation(client):
    first = _chat(client, QUESTION, tool_choice="required").choices[0].message
    (call,) = first.tool_calls
    args = _check_call(call)
    result = {"temperature": 21, "unit": args.get("unit", "celsius"), "sky": "sunny"}
    messages = [
        *QUESTION,
        first.model_dump(exclude_none=True),  # the SDK's assistant message, echoed back
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
    ]
    second = _chat(client, messages, tool_choice="none", max_tokens=40)
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length")
    assert answer.message.tool_calls is None
    assert isinstance(answer.message.content, str) and answer.message.content.strip()
    # The call and its result are in the prompt (no tools are rendered with "none").
    alone = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1)
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 20
    # With tools still offered (auto) the answer is either text or a parseable call.
    auto = _chat(client, messages, tool_choice="auto", max_tokens=60).choices[0]
    if auto.message.tool_calls:
        for c in auto.message.tool_calls:
            json.loads(c.function.arguments)
    else:
        assert auto.message.content


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_tool_errors(client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, QUESTION, **kw)
    assert err.value.body["param"] == param


def test_bad_tool_definitions(client):
    bad_tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "obj"}}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=bad_tools)
    assert err.value.body["param"] == "tools.0.function.parameters"
    bad_call = [
        *QUESTION,
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {}}]},
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=bad_call)
    assert err.value.body["param"] == "messages.1.tool_calls.0"
