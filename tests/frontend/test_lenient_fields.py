"""Request fields as vLLM and SGLang take them: unknown fields ignored (one warning per
request), `--strict-request-fields` refusing them, and the extensions that change the
output (include_stop_str_in_output, skip_special_tokens, cache_salt, chat_template_kwargs,
allowed_tools, message shapes). Shared server: conftest's `http`; strict: its own."""

from __future__ import annotations

import json
import logging
import uuid

import httpx
import pytest

from radixlm.frontend.chat_template import ChatPrompts
from radixlm.frontend.protocol import ChatCompletionRequest, check_supported
from radixlm.frontend.tool_prompt import ToolSetup

from .conftest import running_server

CMPL, CHAT, GEN = "/v1/completions", "/v1/chat/completions", "/generate"
USER = [{"role": "user", "content": "Say hi."}]
IM_END = 2  # SmolLM2's <|im_end|> (its EOS)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}

# Every field of issue 41's list, each on the route that takes it: accepted (HTTP 200).
ACCEPTED = [
    (CMPL, {"include_stop_str_in_output": True, "stop": "."}),
    (CMPL, {"skip_special_tokens": False}),
    (CMPL, {"spaces_between_special_tokens": False}),
    (CMPL, {"cache_salt": "tenant-a"}),
    (CMPL, {"priority": 3}),
    (CMPL, {"prompt_cache_key": "k", "safety_identifier": "user-1"}),
    (
        CMPL,
        {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}},
    ),
    (CHAT, {"chat_template_kwargs": {"enable_thinking": False}}),
    (CHAT, {"separate_reasoning": True, "verbosity": "low"}),
    (CHAT, {"include_stop_str_in_output": True, "skip_special_tokens": True}),
    (
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}
                    ],
                },
                {"role": "assistant", "content": "Hello", "reasoning_content": "They greet me."},
                {"role": "user", "content": "Again."},
            ]
        },
    ),
    (GEN, {"lora_path": None, "cache_salt": "tenant-a"}),
]


def _post(http: httpx.Client, route: str, extra: dict) -> httpx.Response:
    base = {
        CMPL: {"prompt": "Hello", "max_tokens": 3, "temperature": 0},
        CHAT: {"messages": USER, "max_tokens": 3, "temperature": 0},
        GEN: {"text": "Hello", "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
    }.get(route, {})
    return http.post(route, json={**base, **extra})


@pytest.mark.parametrize("route,extra", ACCEPTED, ids=lambda v: v if isinstance(v, str) else "")
def test_listed_fields_are_accepted(http, route, extra):
    r = _post(http, route, extra)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "route,extra",
    [
        (CMPL, {"bogus": 1, "another_one": {"x": 1}}),
        (CHAT, {"messages": [{"role": "user", "content": "Hi", "vendor_hint": 1}]}),
        (CHAT, {"stream": True, "stream_options": {"include_usage": True, "future": 1}}),
        (GEN, {"bogus": 1, "sampling_params": {"max_new_tokens": 2, "not_a_param": 1}}),
    ],
)
def test_unknown_fields_are_ignored_by_default(http, route, extra):
    assert _post(http, route, extra).status_code == 200


def test_a_known_field_keeps_its_type(http):
    r = _post(http, CMPL, {"skip_special_tokens": "no"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "skip_special_tokens"
    r = _post(http, CMPL, {"cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_one_warning_names_the_ignored_fields(caplog):
    body = {"messages": [{"role": "user", "content": "x", "foo": 1}], "bar": 2, "user": "u"}
    req = ChatCompletionRequest.model_validate(body)
    with caplog.at_level(logging.WARNING, logger="radixlm.frontend.protocol"):
        check_supported(req, strict=False, unknown=["sampling_params.baz"])
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring request fields: user, bar, messages.0.foo, sampling_params.baz"
    ]


def test_include_stop_str_in_output_keeps_the_stop_string(http):
    body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": "."}
    plain = http.post(CMPL, json=body).json()["choices"][0]
    kept = http.post(CMPL, json={**body, "include_stop_str_in_output": True}).json()["choices"][0]
    assert not plain["text"].endswith(".") and plain["finish_reason"] == "stop"
    assert kept["text"] == plain["text"] + "."


def test_skip_special_tokens_false_writes_special_tokens(http):
    body = {
        "messages": USER,
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": True,
        "logit_bias": {str(IM_END): 100},
    }
    assert http.post(CHAT, json=body).json()["choices"][0]["message"]["content"] == ""
    shown = http.post(CHAT, json={**body, "skip_special_tokens": False}).json()
    assert shown["choices"][0]["message"]["content"] == "<|im_end|>" * 3
    gen = {
        "text": "Hi",
        "sampling_params": {
            "max_new_tokens": 2,
            "temperature": 0,
            "ignore_eos": True,
            "logit_bias": {str(IM_END): 100},
            "skip_special_tokens": False,
        },
    }
    assert http.post(GEN, json=gen).json()["text"] == "<|im_end|>" * 2


def test_cache_salt_isolates_cached_prefixes(http):
    prompt = f"{uuid.uuid4().hex} " + "The quick brown fox jumps over the lazy dog. " * 8

    def cached(salt: str | None) -> int:
        body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
        if salt is not None:
            body["cache_salt"] = salt
        usage = http.post(CMPL, json=body).json()["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"]

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0  # same salt: the prefix is shared
    assert cached("tenant-b") == 0  # another salt never sees it
    assert cached(None) == 0  # nor does the default namespace
    gen = {"text": prompt, "sampling_params": {"max_new_tokens": 1}, "cache_salt": "tenant-b"}
    assert http.post(GEN, json=gen).json()["meta_info"]["cached_tokens"] > 0


def test_allowed_tools_restricts_the_calls(http):
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "get_time"}}],
        },
    }
    body = {
        "messages": USER,
        "tools": [WEATHER, TIME],
        "tool_choice": choice,
        "max_tokens": 60,
        "temperature": 0,
    }
    r = http.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert calls and {c["function"]["name"] for c in calls} == {"get_time"}
    bad = {
        **choice,
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "name": "nope"}]},
    }
    r = http.post(CHAT, json={**body, "tool_choice": bad})
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"]


def test_custom_tools_are_refused_with_a_clear_message(http):
    custom = {"type": "custom", "custom": {"name": "shell", "description": "run a command"}}
    r = http.post(CHAT, json={"messages": USER, "tools": [custom]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tools.0.type" and "custom tools" in err["message"]
    assert "not supported" in err["message"]


def test_tool_call_arguments_as_object_render_like_the_json_string(http):
    def prompt_tokens(arguments) -> int:
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
        messages = [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
        body = {"messages": messages, "tools": [WEATHER], "max_tokens": 1}
        r = http.post(CHAT, json=body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens({"city": "Paris"}) == prompt_tokens(json.dumps({"city": "Paris"}))


def test_chat_template_kwargs_reach_the_template(tokenizer):
    tok = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tok.chat_template = "{% if enable_thinking %}<think>{% endif %}{{ messages[0]['content'] }}"
    chats = ChatPrompts(tok)
    msgs = [{"role": "user", "content": "Hi"}]
    none = ToolSetup([], None, False)
    assert tok.decode(chats.ids(msgs, none, {"enable_thinking": True})) == "<think>Hi"
    assert tok.decode(chats.ids(msgs, none, {"enable_thinking": False})) == "Hi"


def test_chat_template_kwargs_may_not_set_render_options(http):
    r = http.post(CHAT, json={"messages": USER, "chat_template_kwargs": {"tokenize": False}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "chat_template_kwargs.tokenize"


@pytest.fixture(scope="module")
def strict() -> httpx.Client:
    with running_server("--strict-request-fields") as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


@pytest.mark.parametrize(
    "route,extra,param",
    [
        (CMPL, {"bogus": 1}, "bogus"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "Hi", "vendor_hint": 1}]},
            "messages.0.vendor_hint",
        ),
        (CHAT, {"stream": True, "stream_options": {"future": 1}}, "stream_options.future"),
        (GEN, {"bogus": 1}, "bogus"),
        (GEN, {"sampling_params": {"not_a_param": 1}}, "sampling_params.not_a_param"),
    ],
)
def test_strict_mode_refuses_unknown_fields(strict, route, extra, param):
    r = _post(strict, route, extra)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param
    assert err["code"] == "unknown_parameter"


@pytest.mark.parametrize("route,extra", ACCEPTED)
def test_strict_mode_accepts_the_known_extensions(strict, route, extra):
    assert _post(strict, route, extra).status_code == 200


def test_strict_mode_covers_the_responses_api(strict):
    r = strict.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2, "bogus": 1})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "bogus"
    assert r.json()["error"]["code"] == "unknown_parameter"


# ---- unknown fields inside Responses items, tool definitions, token routes -------------

R_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
RESPONSES_UNKNOWN = [
    ({"input": [{"role": "user", "content": "Hi", "vendor": 1}]}, "input.0.vendor"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi", "x": 1}]}]},
        "input.0.content.0.x",
    ),
    ({"input": "Weather?", "tools": [{**R_TOOL, "vendor": 1}]}, "tools.0.vendor"),
]
TOOL_ROUTES_UNKNOWN = [
    (CHAT, {"tools": [{**WEATHER, "vendor": 1}]}, "tools.0.vendor"),
    (
        CHAT,
        {"tools": [{**WEATHER, "function": {**WEATHER["function"], "vendor": 1}}]},
        "tools.0.function.vendor",
    ),
    ("/tokenize", {"prompt": "Hi", "bogus": 1}, "bogus"),
    ("/detokenize", {"tokens": [1], "bogus": 1}, "bogus"),
    ("/abort_request", {"rid": "nope", "bogus": 1}, "bogus"),
]


@pytest.mark.parametrize("body, param", RESPONSES_UNKNOWN)
def test_unknown_responses_fields_are_ignored(http, body, param):
    forced = {"tool_choice": "required"} if "tools" in body else {}
    r = http.post(
        "/v1/responses",
        json={**body, **forced, "max_output_tokens": 40, "store": False, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    if forced:  # the tool still works without the unknown field
        (call,) = [i for i in r.json()["output"] if i["type"] == "function_call"]
        assert call["name"] == "get_weather"


@pytest.mark.parametrize("route, extra, param", TOOL_ROUTES_UNKNOWN)
def test_unknown_fields_in_tools_and_token_routes_are_ignored(http, route, extra, param):
    r = _post(http, route, extra)
    if route == "/abort_request":  # accepted, then nothing runs with that id
        assert r.status_code == 404 and r.json()["error"]["param"] == "rid"
    else:
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, param", RESPONSES_UNKNOWN)
def test_strict_mode_refuses_unknown_responses_fields(strict, body, param):
    r = strict.post("/v1/responses", json={**body, "max_output_tokens": 2})
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, "unknown_parameter")
    assert err["message"] == f"Unrecognized request argument supplied: {param}"


@pytest.mark.parametrize("route, extra, param", TOOL_ROUTES_UNKNOWN)
def test_strict_mode_refuses_unknown_fields_in_tools_and_token_routes(strict, route, extra, param):
    r = _post(strict, route, extra)
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, "unknown_parameter")
