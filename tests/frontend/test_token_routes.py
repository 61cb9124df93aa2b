"""POST /tokenize, /detokenize and /abort_request on the shared server: token ids as the
generation routes encode them, text of ids, and stopping running requests by id."""

from __future__ import annotations

import threading
import time

import pytest

from tests.frontend.conftest import CHAT_MESSAGES, chat_ids, wait_idle


def test_tokenize_a_prompt_as_completions_encode_it(http, tokenizer):
    body = http.post("/tokenize", json={"prompt": "Once upon a time"}).json()
    ids = tokenizer.encode("Once upon a time")
    assert body == {"tokens": ids, "count": len(ids), "max_model_len": 8192}
    # The same ids a completion is prefilled with.
    usage = http.post(
        "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 1}
    ).json()["usage"]
    assert usage["prompt_tokens"] == len(ids)


def test_tokenize_messages_as_chat_renders_them(http, tokenizer):
    body = http.post("/tokenize", json={"messages": CHAT_MESSAGES}).json()
    assert body["tokens"] == chat_ids(tokenizer, CHAT_MESSAGES)
    assert body["count"] == len(body["tokens"])


def test_detokenize_round_trips(http, tokenizer):
    ids = tokenizer.encode("The capital of France is Paris.")
    assert http.post("/detokenize", json={"tokens": ids}).json() == {
        "prompt": "The capital of France is Paris."
    }


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": CHAT_MESSAGES}, "messages"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, "tokens.0"),
        ("/abort_request", {}, "rid"),
        ("/abort_request", {"rid": "x", "abort_all": True}, "abort_all"),
    ],
)
def test_bad_bodies_are_400(http, path, body, param):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_abort_an_unknown_request_is_404(http):
    r = http.post("/abort_request", json={"rid": "no-such-request"})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "rid"


def test_abort_a_running_generate_by_its_rid(http):
    """A long /generate (rid given) is stopped mid-way: it ends with finish_reason abort,
    fewer tokens than asked, and the KV pool is idle again."""
    result = {}

    def run():
        body = {
            "text": "Once upon a time",
            "rid": "long-one",
            "sampling_params": {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True},
        }
        result["body"] = http.post("/generate", json=body).json()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while True:  # until the request is running
        r = http.post("/abort_request", json={"rid": "long-one"})
        if r.status_code == 200:
            assert r.json() == {"aborted": ["long-one"]}
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    thread.join(60)
    meta = result["body"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["completion_tokens"] < 4000
    wait_idle(http)


def test_abort_all_stops_a_chat_with_n_choices(http):
    """abort_all reaches every choice of a chat completion (ids `{id}-{i}`); the chat
    answers 400 request_aborted."""
    result = {}

    def run():
        body = {
            "messages": CHAT_MESSAGES,
            "n": 2,
            "max_tokens": 4000,
            "temperature": 0,
            "ignore_eos": True,
        }
        result["body"] = http.post("/v1/chat/completions", json=body).json()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    aborted: list[str] = []
    while len(aborted) < 2:
        aborted += http.post("/abort_request", json={"abort_all": True}).json()["aborted"]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    thread.join(60)
    assert all(r.startswith("chatcmpl-") for r in aborted)
    # OpenAI's API has no "abort" finish_reason: a 400 naming the route, not a 500.
    assert result["body"]["error"]["code"] == "request_aborted"
    assert "/abort_request" in result["body"]["error"]["message"]
    wait_idle(http)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tokenize_messages_with_tools_counts_what_chat_sends(http):
    """The tools are rendered as chat renders them: the count is chat's prompt_tokens."""
    plain = http.post("/tokenize", json={"messages": CHAT_MESSAGES}).json()
    body = {"messages": CHAT_MESSAGES, "tools": [WEATHER_TOOL]}
    with_tools = http.post("/tokenize", json=body).json()
    assert with_tools["count"] > plain["count"] + 20  # the tool list is in the prompt
    usage = http.post("/v1/chat/completions", json={**body, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == with_tools["count"]
    # tool_choice "none" renders no tools, as on chat.
    none = http.post("/tokenize", json={**body, "tool_choice": "none"}).json()
    assert none["tokens"] == plain["tokens"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "Hi", "tools": [WEATHER_TOOL]}, "tools"),
        ({"messages": CHAT_MESSAGES, "tools": [{"type": "function"}]}, "tools.0"),
        ({"messages": CHAT_MESSAGES, "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_tokenize_bad_tools_are_400(http, body, param):
    r = http.post("/tokenize", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
