"""The HTTP layer maps errors by their type and fields, never by their text, and each
route renames the runtime's field names to its own. No server: the routes' request
preparation runs against a TokenizerManager that is never started."""

from __future__ import annotations

import json
import logging

import pytest

from radixlm.config import ServerArgs
from radixlm.errors import (
    EngineClosedError,
    InvalidRequestError,
    ModelNotFoundError,
    QueueFullError,
    RadixLMError,
    RequestTimeoutError,
    RequestTooLargeError,
    ServerError,
)
from radixlm.frontend.errors import APIError, from_exception, log_failure, renamed
from radixlm.frontend.serving_native import NativeServing
from radixlm.frontend.serving_openai import OpenAIServing
from radixlm.runtime.server.ipc import IpcPaths
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

from .conftest import MODEL


def _manager(tokenizer, max_total_tokens: int) -> TokenizerManager:
    facts = {"vocab_size": 49152, "context_length": 64, "max_total_tokens": max_total_tokens}
    ipc = IpcPaths("/nonexistent", "ipc://a", "ipc://b", "ipc://c")
    return TokenizerManager(ServerArgs(model=MODEL), ipc, facts, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def tm(tokenizer):
    return _manager(tokenizer, 96)


@pytest.fixture(scope="module")
def small_pool(tokenizer):
    """A KV pool (16 tokens) smaller than the context (64 tokens)."""
    return _manager(tokenizer, 16)


def test_invalid_request_maps_to_its_own_param_and_code():
    exc = InvalidRequestError("top_k must be -1 or >= 1 (see max_new_tokens)", param="x", code="c")
    err = from_exception(exc)
    assert (err.status, err.type, err.param, err.code) == (400, "invalid_request_error", "x", "c")
    assert err.message == str(exc)
    assert from_exception(InvalidRequestError("logit_bias is wrong")).param is None


@pytest.mark.parametrize(
    "exc, status, type_, code",
    [
        (
            RequestTooLargeError("prompt too long", param="prompt"),
            400,
            "invalid_request_error",
            "context_length_exceeded",
        ),
        (QueueFullError("the waiting queue is full"), 503, "server_error", "queue_full"),
        (ServerError("the server is shutting down"), 503, "server_error", None),
        (EngineClosedError("the engine was shut down"), 503, "server_error", None),
        (RequestTimeoutError("past --request-timeout"), 504, "server_error", "request_timeout"),
        (ModelNotFoundError("no model 'x'"), 404, "invalid_request_error", "model_not_found"),
        (RadixLMError("odd"), 500, "server_error", None),
    ],
)
def test_error_types_map_to_statuses(exc, status, type_, code):
    err = from_exception(exc)
    assert (err.status, err.type, err.code) == (status, type_, code)
    assert err.message == str(exc)


def test_unknown_errors_are_500_and_logged(caplog):
    exc = RuntimeError("max_new_tokens must be >= 0")  # text that names a field: ignored
    err = from_exception(exc)
    assert (err.status, err.message, err.param, err.code) == (
        500,
        "internal server error",
        None,
        None,
    )
    with caplog.at_level(logging.ERROR, logger="radixlm.frontend.errors"):
        log_failure("POST /x", exc, err)
    assert "POST /x failed" in caplog.text


def test_renamed_uses_the_table_then_the_default():
    exc = InvalidRequestError("max_new_tokens must be >= 0", param="max_new_tokens", code="v")
    err = renamed(exc, {"max_new_tokens": "max_tokens"})
    assert (err.status, err.param, err.code, err.message) == (400, "max_tokens", "v", str(exc))
    assert renamed(exc, {}).param is None
    assert renamed(exc, {}, default="sampling_params").param == "sampling_params"
    assert renamed(InvalidRequestError("no field"), {}, default="d").param == "d"


def _completion(serving: OpenAIServing, **body) -> None:
    serving._completion_job(json.dumps({"prompt": "Hi", **body}).encode())


def _chat(serving: OpenAIServing, **body) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    serving._chat_job(json.dumps({"messages": messages, **body}).encode())


@pytest.mark.parametrize(
    "run, body, param, code",
    [
        (_completion, {"top_k": 0}, "top_k", "invalid_value"),
        (_completion, {"min_tokens": 10, "max_tokens": 2}, "min_tokens", "invalid_value"),
        (_chat, {"min_tokens": 10, "max_tokens": 2}, "min_tokens", "invalid_value"),
        (_completion, {"stop_token_ids": [10**9]}, "stop_token_ids", "invalid_value"),
        (_completion, {"logit_bias": {"60000": 1}}, "logit_bias", "invalid_value"),
        (_completion, {"prompt": [10**8]}, "prompt", "invalid_value"),
        (_chat, {"max_tokens": 60}, "max_tokens", "context_length_exceeded"),
        (_completion, {"prompt": "word " * 100}, "prompt", "context_length_exceeded"),
        (
            _chat,
            {"messages": [{"role": "user", "content": "a" * 10**6}]},
            "messages",
            "context_length_exceeded",
        ),
    ],
)
def test_openai_routes_rename_runtime_fields(tm, run, body, param, code):
    with pytest.raises(APIError) as err:
        run(OpenAIServing(tm), **body)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


@pytest.mark.parametrize(
    "run, body, param",
    [
        (_completion, {"max_tokens": 20}, "max_tokens"),
        (_chat, {"max_tokens": 20}, "max_tokens"),
        (_chat, {"max_completion_tokens": 20}, "max_completion_tokens"),
    ],
)
def test_kv_pool_overflow_names_the_requests_max_tokens_field(small_pool, run, body, param):
    """The runtime's check_fits names max_new_tokens; the route says which of its fields
    set it."""
    with pytest.raises(APIError) as err:
        run(OpenAIServing(small_pool), **body)
    assert (err.value.param, err.value.code) == (param, "context_length_exceeded")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"text": "x", "sampling_params": {"top_k": 0}}, "sampling_params"),
        ({"text": "x", "sampling_params": {"stop_token_ids": [10**9]}}, "sampling_params"),
        ({"text": "x", "sampling_params": {"logit_bias": {"60000": 1}}}, "sampling_params"),
        (
            {"text": "x", "sampling_params": {"regex": "a", "ebnf": "root ::= 'a'"}},
            "sampling_params",
        ),
        ({"text": "x", "sampling_params": [{}, {}]}, "sampling_params"),
        ({"input_ids": [10**8]}, "input_ids"),
        ({"text": "word " * 100}, "text"),
        (
            {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 3},
            "logprob_start_len",
        ),
        ({"text": "x", "return_logprob": True, "top_logprobs_num": 10**6}, "top_logprobs_num"),
    ],
)
def test_native_route_renames_runtime_fields(tm, body, param):
    with pytest.raises(APIError) as err:
        NativeServing(tm)._prepare(json.dumps(body).encode())
    assert (err.value.status, err.value.param) == (400, param)


def test_native_kv_pool_overflow_is_on_sampling_params(small_pool):
    body = {"text": "x", "sampling_params": {"max_new_tokens": 20}}
    with pytest.raises(APIError) as err:
        NativeServing(small_pool)._prepare(json.dumps(body).encode())
    assert (err.value.param, err.value.code) == ("sampling_params", "context_length_exceeded")
