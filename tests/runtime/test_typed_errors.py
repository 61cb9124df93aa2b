"""Request errors carry their field (`param`) and OpenAI `code` from where they are raised,
across the process boundary too; finish reasons are a str enum with the wire values."""

from __future__ import annotations

import json

import msgspec
import pytest

from radixlm.errors import (
    EngineClosedError,
    InvalidRequestError,
    QueueFullError,
    RequestTooLargeError,
    ServerError,
)
from radixlm.runtime.executor.memory import check_fits
from radixlm.runtime.sampling.grammar import GrammarCompiler, check_json_schema
from radixlm.runtime.sampling.logprobs import LogprobOptions
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.stop import StopChecker
from radixlm.runtime.server import messages as m
from radixlm.runtime.server.request_checks import check_request

LIMITS = {"vocab_size": 100, "context_len": 64, "max_total_tokens": 128, "page_size": 1}


@pytest.mark.parametrize(
    "value, param, code",
    [
        ({"top_k": -5}, "top_k", "invalid_value"),
        ({"top_k": 0}, "top_k", "invalid_value"),
        ({"temperature": -1.0}, "temperature", "invalid_value"),
        ({"top_p": 0.0}, "top_p", "invalid_value"),
        ({"min_p": 1.0}, "min_p", "invalid_value"),
        ({"seed": -1}, "seed", "invalid_value"),
        ({"max_new_tokens": -1}, "max_new_tokens", "invalid_value"),
        ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens", "invalid_value"),
        ({"stop": [""]}, "stop", "invalid_value"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "invalid_value"),
        ({"frequency_penalty": 3.0}, "frequency_penalty", "invalid_value"),
        ({"presence_penalty": float("nan")}, "presence_penalty", "invalid_value"),
        ({"repetition_penalty": 0.0}, "repetition_penalty", "invalid_value"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {3: 500.0}}, "logit_bias", "invalid_value"),
        ({"bogus": 1}, "sampling_params", "unknown_parameter"),
        ({"top_k": "many"}, "sampling_params", "invalid_type"),
        ({"regex": "a", "ebnf": "root ::= 'a'"}, None, "invalid_value"),
    ],
)
def test_sampling_params_errors_name_their_field(value, param, code):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_any(value)
    assert (err.value.param, err.value.code) == (param, code)


def test_sampling_params_that_are_not_a_dict():
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_any([1])
    assert (err.value.param, err.value.code) == ("sampling_params", "invalid_type")


@pytest.mark.parametrize(
    "ids, params, param",
    [
        ([], {}, "prompt"),
        ([1, 100], {}, "prompt"),
        ([1], {"stop_token_ids": [100]}, "stop_token_ids"),
        ([1], {"logit_bias": {100: 1.0}}, "logit_bias"),
    ],
)
def test_check_request_names_the_bad_field(ids, params, param):
    with pytest.raises(InvalidRequestError) as err:
        check_request(ids, SamplingParams.from_any(params), **LIMITS)
    assert not isinstance(err.value, RequestTooLargeError)
    assert (err.value.param, err.value.code) == (param, "invalid_value")


@pytest.mark.parametrize(
    "prompt_len, max_new_tokens, param",
    [(64, 1, "prompt"), (200, 1, "prompt"), (40, 20, "max_new_tokens")],
)
def test_too_large_is_context_length_exceeded(prompt_len, max_new_tokens, param):
    limits = {**LIMITS, "max_total_tokens": 48}
    with pytest.raises(RequestTooLargeError) as err:
        check_request([1] * prompt_len, SamplingParams(max_new_tokens=max_new_tokens), **limits)
    assert (err.value.param, err.value.code) == (param, "context_length_exceeded")
    with pytest.raises(RequestTooLargeError) as direct:
        check_fits(prompt_len, max_new_tokens, context_len=64, total_tokens=48, page_size=1)
    assert direct.value.param == param


def test_error_fields_are_keywords_with_type_defaults():
    plain = InvalidRequestError("top_k must be -1 or >= 1")
    assert (plain.param, plain.code, str(plain)) == (None, None, "top_k must be -1 or >= 1")
    big = RequestTooLargeError("too long", param="prompt")
    assert big.code == "context_length_exceeded" and isinstance(big, ValueError)
    assert RequestTooLargeError("x", code="other").code == "other"
    copy = big.copy()
    assert copy is not big and type(copy) is RequestTooLargeError
    assert (str(copy), copy.param, copy.code) == ("too long", "prompt", "context_length_exceeded")


@pytest.mark.parametrize(
    "options, prompt_len, param",
    [
        (LogprobOptions(return_logprob=1), None, "return_logprob"),
        (LogprobOptions(top_logprobs_num=1.5), None, "top_logprobs_num"),
        (LogprobOptions(logprob_start_len=-2), None, "logprob_start_len"),
        (LogprobOptions(return_logprob=True, logprob_start_len=3), 3, "logprob_start_len"),
        (LogprobOptions(top_logprobs_num=101), None, "top_logprobs_num"),
    ],
)
def test_logprob_option_errors_name_their_field(options, prompt_len, param):
    with pytest.raises(InvalidRequestError) as err:
        options.validate(100, prompt_len)
    assert err.value.param == param


def test_grammar_errors_name_their_kind_also_from_the_cache():
    compiler = GrammarCompiler(None, 10, [])
    for _ in range(2):  # compiled, then the cached failure again (a fresh error)
        with pytest.raises(InvalidRequestError, match="json_schema is not valid JSON") as err:
            compiler.compile("json_schema", "{oops")
        assert (err.value.param, err.value.code) == ("json_schema", "invalid_value")
    assert err.value is not compiler._cache[("json_schema", "{oops")]
    with pytest.raises(InvalidRequestError) as cached:
        compiler.cached("json_schema", "{oops")
    assert cached.value.param == "json_schema"


def test_json_schema_check_names_the_callers_field():
    with pytest.raises(InvalidRequestError, match="^parameters is not a valid JSON schema"):
        check_json_schema('{"type": 1}', field="parameters")
    with pytest.raises(InvalidRequestError) as err:
        check_json_schema("[]", field="parameters")
    assert err.value.param == "parameters"


@pytest.mark.parametrize(
    "exc, expected",
    [
        (InvalidRequestError("bad", param="top_k", code="invalid_value"), InvalidRequestError),
        (RequestTooLargeError("cannot fit", param="max_new_tokens"), RequestTooLargeError),
        (QueueFullError("queue full"), QueueFullError),
        (ServerError("down"), ServerError),
        (EngineClosedError("closed"), ServerError),  # other radixlm errors: server errors
    ],
)
def test_refusals_cross_the_process_boundary_typed(exc, expected):
    back = m.decode(m.encode(m.ReqError.of("r", exc)))
    assert isinstance(back, m.ReqError) and back.rid == "r"
    err = back.error()
    assert type(err) is expected and str(err) == str(exc)
    if isinstance(exc, InvalidRequestError):
        assert (err.param, err.code) == (exc.param, exc.code)


def test_unknown_refusal_kind_is_a_decode_error():
    raw = msgspec.msgpack.encode({"type": "req_error", "rid": "r", "kind": "?", "message": "x"})
    with pytest.raises(msgspec.ValidationError):
        m.decode(raw)


def test_finish_reasons_keep_their_wire_strings():
    assert [r.value for r in FinishReason] == ["stop", "length", "abort"]
    for reason in FinishReason:
        assert reason == reason.value and str(reason) == f"{reason}" == reason.value
        assert msgspec.json.encode(reason) == json.dumps(reason).encode() == f'"{reason}"'.encode()
        assert (
            msgspec.json.encode({"finish_reason": reason})
            == json.dumps({"finish_reason": reason.value}, separators=(",", ":")).encode()
        )
    out = m.BatchStrOut(
        ["a", "b"],
        [[5], []],
        [FinishReason.STOP, None],
        [5, None],
        [3, 3],
        [1, 0],
        [0, 0],
        ["hi", ""],
    )
    back = m.decode(m.encode(out))
    assert back.finish_reasons == ["stop", None]
    assert back.finish_reasons[0] is FinishReason.STOP


def test_stop_checker_reports_enum_members():
    stop = StopChecker(eos_token_ids=[0], context_len=64)
    req = Req(rid="r", input_ids=[1], params=SamplingParams(max_new_tokens=2))
    req.output_ids = [0]
    assert stop.check(req, 0) is FinishReason.STOP
    req.output_ids = [5, 6]
    assert stop.check(req, 6) is FinishReason.LENGTH
    req.output_ids = [5]
    assert stop.check(req, 5) is None
