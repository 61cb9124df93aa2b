"""Every input is validated before it can fail later (issue 40): ints beyond their bounds,
tokens beyond the context and prompts over the context answer 400 with type, param and
code on every route, never a 500 from the scheduler hand-off; every 400 has a code.

The server cases send each trigger to a real server; the others check the route and
TokenizerManager pieces without one."""

from __future__ import annotations

import json

import pytest

from radixlm.config import ServerArgs
from radixlm.errors import InvalidRequestError
from radixlm.frontend.errors import APIError, from_exception, invalid_request, renamed
from radixlm.frontend.serving_native import MAX_RID_CHARS, NativeServing
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.server.ipc import IpcPaths
from radixlm.runtime.server.messages import GenerateReq
from radixlm.runtime.server.tokenizer_manager import TokenizerManager, _encode_request

from .conftest import MODEL

CMPL, CHAT, GEN = "/v1/completions", "/v1/chat/completions", "/generate"
USER = [{"role": "user", "content": "Hi"}]
HUGE = 2**64  # 18446744073709551616: one more than msgpack's largest int
TOO_LONG = "hello " * 9000  # about 9,000 tokens; the server's context is 8,192

# (route, body, param, code)
TRIGGERS = [
    (CMPL, {"prompt": "hi", "max_tokens": 2, "top_k": HUGE}, "top_k", "invalid_value"),
    (CHAT, {"messages": USER, "max_tokens": 2, "top_k": HUGE}, "top_k", "invalid_value"),
    (GEN, {"text": "hi", "sampling_params": {"top_k": HUGE}}, "sampling_params", "invalid_value"),
    (
        GEN,
        {"text": "hi", "sampling_params": {"max_new_tokens": HUGE}},
        "sampling_params",
        "invalid_value",
    ),
    (GEN, {"text": "hi", "logprob_start_len": HUGE}, "logprob_start_len", "invalid_value"),
    (
        GEN,
        {"text": "hi", "return_logprob": True, "logprob_start_len": HUGE},
        "logprob_start_len",
        "invalid_value",
    ),
    (GEN, {"text": "hi", "top_logprobs_num": HUGE}, "top_logprobs_num", "invalid_value"),
    (CMPL, {"prompt": "hi", "stop_token_ids": [HUGE]}, "stop_token_ids", "invalid_value"),
    (
        GEN,
        {"text": "hi", "sampling_params": {"stop_token_ids": [HUGE]}},
        "sampling_params",
        "invalid_value",
    ),
    (CMPL, {"prompt": "hi", "seed": HUGE}, "seed", "invalid_value"),
    (GEN, {"text": "hi", "sampling_params": {"seed": HUGE}}, "sampling_params", "invalid_value"),
    (CMPL, {"prompt": "hi", "logit_bias": {str(HUGE): 1}}, "logit_bias", "invalid_value"),
    (CHAT, {"messages": USER, "min_tokens": HUGE}, "min_tokens", "invalid_value"),
    (
        GEN,
        {"text": "hi", "sampling_params": {"min_new_tokens": HUGE, "max_new_tokens": 4}},
        "sampling_params",
        "invalid_value",
    ),
    (CMPL, {"prompt": [HUGE]}, "prompt", "invalid_value"),
    (GEN, {"input_ids": [1, HUGE]}, "input_ids", "invalid_value"),
    (GEN, {"text": "hi", "rid": "r" * (MAX_RID_CHARS + 1)}, "rid", "invalid_value"),
    # Tokens beyond the context: one rule on every route.
    (CMPL, {"prompt": "hi", "max_tokens": 9000}, "max_tokens", "context_length_exceeded"),
    (
        CHAT,
        {"messages": USER, "max_completion_tokens": 9000},
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    (
        GEN,
        {"text": "hi", "sampling_params": {"max_new_tokens": 1_000_000_000}},
        "sampling_params",
        "context_length_exceeded",
    ),
    # A prompt over the context names the route's prompt field.
    (CMPL, {"prompt": TOO_LONG}, "prompt", "context_length_exceeded"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": TOO_LONG}]},
        "messages",
        "context_length_exceeded",
    ),
    (GEN, {"text": TOO_LONG}, "text", "context_length_exceeded"),
    # 400s that had no code.
    (GEN, {}, "text", "invalid_value"),
    (GEN, {"input_ids": []}, "input_ids", "invalid_value"),
    (CMPL, {"prompt": "x", "max_tokens": 0}, "max_tokens", "invalid_value"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, "top_logprobs", "invalid_value"),
]


def _id(case) -> str:
    route, body, param, _ = case
    return f"{route}:{param}:{json.dumps(body)[:50]}"


@pytest.mark.parametrize("route, body, param, code", TRIGGERS, ids=[_id(c) for c in TRIGGERS])
def test_trigger_answers_400_with_type_param_and_code(http, route, body, param, code):
    resp = http.post(route, json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code)
    assert err["message"]


def test_generate_without_max_new_tokens_still_runs(http):
    """An unset max_new_tokens is SGLang's default (128), capped at the context (a stop
    string ends this one early)."""
    body = {"text": "Hello", "sampling_params": {"temperature": 0, "stop": [" "]}}
    resp = http.post(GEN, json=body)
    assert resp.status_code == 200, resp.text
    assert 1 <= resp.json()["meta_info"]["completion_tokens"] <= 128


def test_server_keeps_serving_after_the_triggers(http):
    for route, body, _, _ in TRIGGERS[:3]:
        assert http.post(route, json=body).status_code == 400
    resp = http.post(CMPL, json={"prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
    assert http.get("/health").status_code == 200


# ---- without a server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tm(tokenizer):
    """A TokenizerManager that is never started: context 64 tokens, pool 1,024."""
    facts = {"vocab_size": 49152, "context_length": 64, "max_total_tokens": 1024}
    ipc = IpcPaths("/nonexistent", "ipc://a", "ipc://b", "ipc://c")
    return TokenizerManager(ServerArgs(model=MODEL), ipc, facts, tokenizer=tokenizer)


def _prepare(tm, body: dict):
    return NativeServing(tm)._prepare(json.dumps(body).encode())


def test_native_unset_max_new_tokens_is_capped_at_what_the_context_leaves(tm):
    ids = [1] * 60
    params = _prepare(tm, {"input_ids": ids, "sampling_params": {"min_new_tokens": 10}})[3]
    assert (params[0].max_new_tokens, params[0].min_new_tokens) == (4, 4)
    short = _prepare(tm, {"input_ids": [1] * 10, "sampling_params": {"min_new_tokens": 10}})[3]
    assert (short[0].max_new_tokens, short[0].min_new_tokens) == (54, 10)


def test_native_batch_caps_each_prompt_and_keeps_explicit_values(tm):
    body = {"input_ids": [[1] * 60, [1] * 30], "sampling_params": [{}, {"max_new_tokens": 30}]}
    params = _prepare(tm, body)[3]
    assert [p.max_new_tokens for p in params] == [4, 30]


@pytest.mark.parametrize("max_new_tokens", [5, 10**9])
def test_native_explicit_max_new_tokens_beyond_the_context_is_refused(tm, max_new_tokens):
    body = {"input_ids": [1] * 60, "sampling_params": {"max_new_tokens": max_new_tokens}}
    with pytest.raises(APIError) as err:
        _prepare(tm, body)
    assert (err.value.status, err.value.param, err.value.code) == (
        400,
        "sampling_params",
        "context_length_exceeded",
    )


def test_native_rid_at_the_length_bound_is_accepted(tm):
    assert _prepare(tm, {"text": "x", "rid": "r" * MAX_RID_CHARS})[4] == ["r" * MAX_RID_CHARS]


def test_encode_failure_is_an_invalid_request():
    """The backstop for an int no validation bounded: a 400, not a 500."""
    msg = GenerateReq(rid="r", input_ids=[1], params=SamplingParams(top_k=2**64))
    with pytest.raises(InvalidRequestError) as err:
        _encode_request(msg)
    assert err.value.code == "invalid_value"
    assert from_exception(err.value).status == 400


def test_every_400_has_a_code():
    assert invalid_request("bad").code == "invalid_value"
    assert invalid_request("bad", code="invalid_type").code == "invalid_type"
    plain = InvalidRequestError("no code")
    assert (from_exception(plain).status, from_exception(plain).code) == (400, "invalid_value")
    assert renamed(plain, {}, default="x").code == "invalid_value"
