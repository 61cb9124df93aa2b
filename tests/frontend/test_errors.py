"""Bad input gets HTTP 400 (401 for the API key) with an OpenAI error body, never 422 or
500, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from .conftest import API_KEY, MODEL

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
USER = [{"role": "user", "content": "Hi"}]
TOO_LONG = "hello " * 9000  # about 9,000 tokens; the context is 8,192
HUGE = "a" * 4_000_000  # more characters than 8,192 tokens of the longest token can hold

# (route, body, expected param or None, expected code or None)
BAD = [
    (CMPL, b"{bad", None, "invalid_json"),
    (CMPL, b"", None, "invalid_json"),
    (CMPL, b"[1, 2]", None, "invalid_json"),
    (CMPL, {}, "prompt", "missing_required_parameter"),
    (CMPL, {"prompt": 5}, "prompt", None),
    (CMPL, {"prompt": [True]}, "prompt", None),
    (CMPL, {"prompt": "x", "temperature": "hot"}, "temperature", None),
    (CMPL, {"prompt": "x", "max_tokens": "5"}, "max_tokens", None),
    (CMPL, {"prompt": "x", "stream": "yes"}, "stream", None),
    (CMPL, {"prompt": "x", "stop": 3}, "stop", "invalid_type"),
    (CMPL, {"prompt": "x", "max_tokens": -1}, "max_tokens", None),
    (CMPL, {"prompt": "x", "max_tokens": 0}, "max_tokens", None),
    (CMPL, {"prompt": "x", "max_tokens": 10**9}, "max_tokens", None),
    (CMPL, {"prompt": "x", "max_tokens": 10**30}, "max_tokens", None),
    (CMPL, {"prompt": "x", "temperature": -1}, "temperature", None),
    (CMPL, {"prompt": "x", "top_p": 0}, "top_p", None),
    (CMPL, {"prompt": "x", "top_k": 0}, "top_k", "invalid_value"),
    (CMPL, {"prompt": "x", "seed": -1}, "seed", None),
    (CMPL, {"prompt": "x", "stop": [""]}, "stop", None),
    (CMPL, {"prompt": ""}, "prompt", None),
    (CMPL, {"prompt": []}, "prompt", None),
    (CMPL, {"prompt": [10**8]}, "prompt", None),
    (CMPL, {"prompt": TOO_LONG}, "prompt", "context_length_exceeded"),
    (CMPL, {"prompt": HUGE}, None, None),  # refused before tokenizing
    (CMPL, {"prompt": "x", "stop_token_ids": [10**9]}, "stop_token_ids", "invalid_value"),
    # More sequences than running rows + queue could ever hold: 400, not 503 "retry".
    (CMPL, {"prompt": ["x"] * 40, "n": 128, "max_tokens": 1}, "n", None),
    (
        CHAT,
        {
            "messages": USER,
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
            ],
        },
        "tools.0.function.parameters",
        None,
    ),
    (CMPL, {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", None),
    (CMPL, {"prompt": "x", "frequency_penalty": 3}, "frequency_penalty", None),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages.0.content.0.text",
        None,
    ),
    (CMPL, {"prompt": "x", "min_tokens": 10, "max_tokens": 2}, "min_tokens", "invalid_value"),
    (CMPL, {"prompt": "x", "n": 2, "best_of": 1}, "best_of", None),
    (CHAT, {"messages": []}, "messages", None),
    (CHAT, {"messages": "hi"}, "messages", None),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", None),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, None, None),
    (CHAT, {"messages": [{"role": "user"}]}, "messages.0.content", None),
    (CHAT, {"messages": [{"role": "system", "content": None}, *USER]}, "messages.0.content", None),
    (CHAT, {"messages": [*USER, {"role": "assistant"}, *USER]}, "messages.1.content", None),
    (
        CHAT,
        {"messages": [*USER, {"role": "tool", "tool_call_id": "c"}]},
        "messages.1.content",
        None,
    ),
    (CHAT, {"messages": USER, "max_completion_tokens": -5}, "max_completion_tokens", None),
    (CHAT, {"messages": [{"role": "user", "content": TOO_LONG}]}, "messages", None),
    (CHAT, {"messages": [{"role": "user", "content": HUGE}]}, None, None),
    (CHAT, {"messages": USER, "max_completion_tokens": 9000}, "max_completion_tokens", None),
    (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, "response_format.type", None),
    (
        CHAT,
        {"messages": USER, "tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        "tools.0.type",
        None,
    ),
    (CHAT, {"messages": USER, "functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages.0.content.0",
        "unsupported_parameter",
    ),
    ("/generate", {}, None, None),
    ("/generate", {"text": "x", "input_ids": [1]}, None, None),
    ("/generate", {"input_ids": []}, "input_ids", None),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, None, None),
    ("/generate", {"text": "x", "stream": 1}, "stream", None),
    ("/generate", {"text": TOO_LONG}, "text", None),
    # Prompt logprobs from past the prompt's last position (the prompt is 3 tokens).
    (
        "/generate",
        {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 3},
        "logprob_start_len",
        None,
    ),
]


def _ids(case) -> str:
    route, body = case[0], case[1]
    shown = body.decode() if isinstance(body, bytes) else str(body)
    return f"{route}:{shown[:40]}"


def _assert_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and isinstance(err["message"], str)
    return err


@pytest.mark.parametrize("case", BAD, ids=[_ids(c) for c in BAD])
def test_bad_input_is_400(http, case):
    route, body, param, code = case
    if isinstance(body, bytes):
        resp = http.post(route, content=body, headers=JSON)
    else:
        resp = http.post(route, json=body)
    err = _assert_error(resp, 400)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code


def test_server_keeps_serving_after_errors(http, client):
    for _ in range(3):
        _assert_error(http.post(CMPL, content=b"{", headers=JSON), 400)
    assert http.get("/health").status_code == 200
    resp = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    assert resp.usage.completion_tokens == 2


@pytest.mark.parametrize(
    "route,body",
    [(CMPL, {"prompt": "x", "model": "gpt-4o"}), (CHAT, {"messages": USER, "model": "nope"})],
)
def test_unknown_model_is_404(http, route, body):
    err = _assert_error(http.post(route, json=body), 404)
    assert err["param"] == "model" and err["code"] == "model_not_found"
    assert err["type"] == "invalid_request_error"


def test_openai_client_raises_bad_request(client):
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=2)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=-3)


@pytest.mark.parametrize("header", [None, "Bearer wrong", API_KEY, f"Basic {API_KEY}"])
def test_api_key_required(server, header):
    headers = {"Authorization": header} if header else {}
    with httpx.Client(base_url=server, timeout=30) as raw:
        for method, path in [
            ("GET", "/v1/models"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/generate"),
            ("GET", "/get_server_info"),
            ("POST", "/flush_cache"),
        ]:
            err = _assert_error(raw.request(method, path, headers=headers, json={}), 401)
            assert err["code"] == "invalid_api_key"
        assert raw.get("/health").status_code == 200


def test_openai_client_wrong_key(server):
    import openai

    bad = openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_unknown_route_and_method(http):
    assert _assert_error(http.get("/v1/nothing"), 404)["type"] == "not_found_error"
    assert _assert_error(http.get("/v1/models/gpt-4o"), 404)["code"] == "model_not_found"
    _assert_error(http.get("/v1/completions"), 405)
