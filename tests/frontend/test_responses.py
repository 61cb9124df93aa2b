"""POST /v1/responses and GET /v1/responses/{id} against the real server (bundled model,
greedy): the Responses API over the chat completion path, its items, tools, structured
output, budgets, streaming events, stored conversations and errors."""

from __future__ import annotations

import json

import pytest

from radixlm.frontend.responses_store import ResponseStore, StoredResponse
from tests.frontend.conftest import sse_payloads

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
GREEDY = {"temperature": 0}


def _post(http, **body):
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _text(resp) -> str:
    (item,) = [i for i in resp["output"] if i["type"] == "message"]
    return "".join(p["text"] for p in item["content"])


def _events(http, **body) -> list[dict]:
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return [json.loads(p) for p in sse_payloads(r.iter_lines())]


def test_string_input_equals_the_chat_completion(http):
    msg = "Name a colour."
    chat = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": msg}], "max_tokens": 12, **GREEDY},
    ).json()
    resp = _post(http, input=msg, max_output_tokens=12, **GREEDY)
    assert resp["object"] == "response" and resp["id"].startswith("resp_")
    assert _text(resp) == chat["choices"][0]["message"]["content"]
    usage, cu = resp["usage"], chat["usage"]
    assert usage["input_tokens"] == cu["prompt_tokens"]
    assert usage["output_tokens"] == cu["completion_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    # The same as a message item with input_text parts, and with instructions as system.
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": msg}]}]
    assert _text(_post(http, input=items, max_output_tokens=12, **GREEDY)) == _text(resp)
    sys_chat = http.post(
        "/v1/chat/completions",
        json={
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": msg},
            ],
            "max_tokens": 12,
            **GREEDY,
        },
    ).json()
    with_instr = _post(http, input=msg, instructions="Be brief.", max_output_tokens=12, **GREEDY)
    assert _text(with_instr) == sys_chat["choices"][0]["message"]["content"]
    assert with_instr["instructions"] == "Be brief."


def test_function_call_items_round_trip(http):
    first = _post(
        http,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        **GREEDY,
    )
    (call,) = first["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["call_id"].startswith("call_") and call["status"] == "completed"
    assert set(json.loads(call["arguments"])) == {"city"}
    items = [
        {"role": "user", "content": "What is the weather in Paris?"},
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 C"},
    ]
    second = _post(http, input=items, tools=[WEATHER], max_output_tokens=24, **GREEDY)
    # The chat completion with the same turns gives the same answer.
    chat = http.post(
        "/v1/chat/completions",
        json={
            "messages": [
                {"role": "user", "content": "What is the weather in Paris?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": call["call_id"],
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": call["arguments"]},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call["call_id"], "content": "Sunny, 21 C"},
            ],
            "tools": [
                {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
            ],
            "max_tokens": 24,
            **GREEDY,
        },
    ).json()
    assert second["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    message = chat["choices"][0]["message"]
    if message.get("tool_calls"):
        names = [i["name"] for i in second["output"] if i["type"] == "function_call"]
        assert names == [c["function"]["name"] for c in message["tool_calls"]]
    else:
        assert _text(second) == message["content"]


def test_named_tool_choice_forces_that_function(http):
    other = {**WEATHER, "name": "get_time", "description": "Get the time"}
    resp = _post(
        http,
        input="Hello",
        tools=[WEATHER, other],
        tool_choice={"type": "function", "name": "get_time"},
        **GREEDY,
    )
    calls = [i for i in resp["output"] if i["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0]["arguments"]), dict)
    assert resp["tool_choice"] == {"type": "function", "name": "get_time"}


def test_allowed_tools_choice_limits_the_tools(http):
    other = {**WEATHER, "name": "get_time", "description": "Get the time"}
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    resp = _post(
        http, input="Weather in Paris?", tools=[WEATHER, other], tool_choice=choice, **GREEDY
    )
    assert [i["name"] for i in resp["output"] if i["type"] == "function_call"] == ["get_time"]
    bad = {**choice, "tools": [{"type": "function", "name": "nope"}]}
    r = http.post("/v1/responses", json={"input": "Hi", "tools": [WEATHER], "tool_choice": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice.tools"


def test_json_schema_text_format(http):
    schema = {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "bright": {"type": "boolean"},
        },
        "required": ["colour", "bright"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    resp = _post(http, input="Pick a colour.", text={"format": fmt}, max_output_tokens=60, **GREEDY)
    value = json.loads(_text(resp))
    assert set(value) == {"colour", "bright"} and isinstance(value["bright"], bool)
    assert resp["text"]["format"] == fmt


def test_max_output_tokens_is_incomplete(http):
    resp = _post(http, input="Tell me a long story.", max_output_tokens=3, **GREEDY)
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["usage"]["output_tokens"] == 3
    assert resp["output"][0]["status"] == "incomplete"


def test_stream_events_in_order_and_deltas_equal_the_text(http):
    body = {"input": "Name a colour.", "max_output_tokens": 12, **GREEDY}
    full = _post(http, **body)
    events = _events(http, **body)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if full["status"] == "incomplete" else "response.completed",
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == _text(full)
    assert events[-4]["text"] == text
    last = events[-1]["response"]
    assert _text(last) == text and last["usage"]["output_tokens"] == full["usage"]["output_tokens"]
    assert events[0]["response"]["status"] == "in_progress"


def test_stream_function_call_events(http):
    body = {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required", **GREEDY}
    events = _events(http, **body)
    kinds = [e["type"] for e in events]
    n = kinds.count("response.function_call_arguments.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * n,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    args = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert events[-3]["arguments"] == args and set(json.loads(args)) == {"city"}
    (item,) = events[-1]["response"]["output"]
    assert item == events[-2]["item"] and item["arguments"] == args


def test_previous_response_id_continues_from_the_cache(http):
    first = _post(http, input="My name is Ada. Say hi.", max_output_tokens=8, **GREEDY)
    second = _post(
        http,
        input="What is my name?",
        previous_response_id=first["id"],
        max_output_tokens=8,
        **GREEDY,
    )
    assert second["previous_response_id"] == first["id"]
    # The prompt is the first conversation (prompt + output) then the new turn.
    assert second["usage"]["input_tokens"] > first["usage"]["total_tokens"]
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["input_tokens"]
    stored = http.get(f"/v1/responses/{second['id']}")
    assert stored.status_code == 200 and stored.json() == second


def test_store_false_is_not_kept(http):
    resp = _post(http, input="Hi", max_output_tokens=2, store=False, **GREEDY)
    assert resp["store"] is False
    assert http.get(f"/v1/responses/{resp['id']}").status_code == 404


def test_unknown_ids_are_404(http):
    r = http.post("/v1/responses", json={"input": "Hi", "previous_response_id": "resp_nope"})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["param"] == "previous_response_id"
    r = http.get("/v1/responses/resp_nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        ({"input": []}, "input"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        (
            {"input": "Hi", "text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.name",
        ),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_malformed_requests_are_400_naming_the_field(http, body, param):
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_client_defaults_are_accepted_and_ignored(http):
    extras = {
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "reasoning": {"effort": None},
        "truncation": "disabled",
        "include": ["message.output_text.logprobs"],
        "metadata": {"k": "v"},
        "bogus": 1,  # unknown: ignored unless --strict-request-fields
        "user": "u",
        "prompt_cache_key": "k",
        "safety_identifier": "s",
        "service_tier": "auto",
    }
    plain = _post(http, input="Hi", max_output_tokens=4, **GREEDY)
    resp = _post(http, input="Hi", max_output_tokens=4, **GREEDY, **extras)
    assert _text(resp) == _text(plain) and resp["metadata"] == {"k": "v"}


def test_openai_client_create_and_stream(client):
    model = client.models.list().data[0].id
    resp = client.responses.create(
        model=model, input="Name a colour.", max_output_tokens=8, temperature=0
    )
    assert resp.output_text and resp.usage.input_tokens > 0 and resp.status == "incomplete"
    with client.responses.stream(
        model=model, input="Name a colour.", max_output_tokens=8, temperature=0
    ) as stream:
        events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    # As OpenAI does, a response cut by max_output_tokens ends with response.incomplete
    # (the SDK's get_final_response waits for response.completed only).
    assert events[-1].type == "response.incomplete"
    assert text == resp.output_text == events[-1].response.output_text
    assert client.responses.retrieve(resp.id).output_text == resp.output_text
    # One that finishes: the SDK's own accumulation of the stream.
    with client.responses.stream(
        model=model, input="Say OK.", max_output_tokens=200, temperature=0
    ) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text


def test_store_is_a_bounded_lru():
    store = ResponseStore(2)
    for rid in ("a", "b"):
        store.put(rid, StoredResponse({"id": rid}, []))
    assert store.get("a") is not None  # a is now the most recent
    store.put("c", StoredResponse({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    empty = ResponseStore(0)
    empty.put("a", StoredResponse({"id": "a"}, []))
    assert empty.get("a") is None


@pytest.mark.parametrize("budget", [3, 10, 18])
def test_a_call_cut_by_max_output_tokens_leaks_no_markup(http, budget):
    """A forced call cut by the token budget: no call markup in any message text, streamed
    or not; the non-streamed output drops the cut call; a streamed call already begun
    stays, marked incomplete unless its arguments are whole JSON."""
    body = dict(
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=budget,
        **GREEDY,
    )
    resp = _post(http, **body)
    assert resp["status"] == "incomplete"
    for item in resp["output"]:
        if item["type"] == "message":
            assert "<tool" not in "".join(p["text"] for p in item["content"])
        else:
            json.loads(item["arguments"])  # only whole calls are kept
    events = _events(http, **body)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert "<tool" not in deltas
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    for item in final["output"]:
        if item["type"] == "function_call" and item["status"] == "completed":
            json.loads(item["arguments"])
