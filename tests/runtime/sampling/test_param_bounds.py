"""Every int a request carries is bounded where it is validated (SamplingParams,
LogprobOptions), so a validated request always encodes for the scheduler (msgpack holds
no int of 2**64 or more); check_fits's two rules for tokens beyond the context."""

from __future__ import annotations

import pytest

from radixlm.errors import InvalidRequestError, RequestTooLargeError
from radixlm.runtime.executor.memory import check_fits
from radixlm.runtime.sampling.logprobs import LogprobOptions
from radixlm.runtime.sampling.sampler import MAX_REQUEST_INT, MAX_TOP_K, SamplingParams
from radixlm.runtime.server.messages import GenerateReq, decode, encode

HUGE = 2**64

# (SamplingParams dict, the param at fault)
BEYOND = [
    ({"max_new_tokens": HUGE}, "max_new_tokens"),
    ({"max_new_tokens": MAX_REQUEST_INT + 1}, "max_new_tokens"),
    ({"top_k": HUGE}, "top_k"),
    ({"top_k": MAX_TOP_K + 1}, "top_k"),
    ({"top_k": -HUGE}, "top_k"),
    ({"seed": HUGE}, "seed"),
    ({"seed": 2**63}, "seed"),
    ({"stop_token_ids": [HUGE]}, "stop_token_ids"),
    ({"stop_token_ids": [1, -1]}, "stop_token_ids"),
    ({"logit_bias": {str(HUGE): 1.0}}, "logit_bias"),
    ({"min_new_tokens": HUGE, "max_new_tokens": HUGE}, "max_new_tokens"),
    ({"min_new_tokens": HUGE}, "min_new_tokens"),
]


@pytest.mark.parametrize("values, param", BEYOND, ids=[f"{p}:{v}" for v, p in BEYOND])
def test_sampling_int_beyond_its_bound_names_its_field(values, param):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_any(values)
    assert (err.value.param, err.value.code) == (param, "invalid_value")


def test_stop_token_id_message_gives_the_range_and_value():
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_any({"stop_token_ids": [HUGE]})
    assert str(err.value) == f"stop_token_ids entries must be in [0, 2147483647], got {HUGE}"


def test_values_at_the_bounds_are_accepted_and_encode():
    edge = SamplingParams.from_any(
        {
            "max_new_tokens": MAX_REQUEST_INT,
            "min_new_tokens": MAX_REQUEST_INT,
            "top_k": MAX_TOP_K,
            "seed": 2**63 - 1,
            "stop_token_ids": [0, MAX_REQUEST_INT],
            "logit_bias": {str(MAX_REQUEST_INT): 1.0},
        }
    )
    lp = LogprobOptions(True, MAX_REQUEST_INT, 5)
    lp.validate(vocab_size=100)
    msg = GenerateReq(rid="r", input_ids=[1], params=edge, logprobs=lp)
    assert decode(encode(msg)) == msg


def test_unbounded_params_do_not_encode():
    """Why the bounds exist: a SamplingParams built without validation fails to encode."""
    with pytest.raises(OverflowError):
        encode(GenerateReq(rid="r", input_ids=[1], params=SamplingParams(top_k=HUGE)))


@pytest.mark.parametrize(
    "options, param",
    [
        (LogprobOptions(False, HUGE, 0), "logprob_start_len"),  # even without return_logprob
        (LogprobOptions(True, MAX_REQUEST_INT + 1, 0), "logprob_start_len"),
        (LogprobOptions(False, -2, 0), "logprob_start_len"),
        (LogprobOptions(True, -1, HUGE), "top_logprobs_num"),
        (LogprobOptions(True, -1, 101), "top_logprobs_num"),
    ],
)
def test_logprob_options_bounds(options, param):
    with pytest.raises(InvalidRequestError) as err:
        options.validate(vocab_size=100)
    assert (err.value.param, err.value.code) == (param, "invalid_value")


LIMITS = {"context_len": 64, "total_tokens": 1024, "page_size": 1}


def test_check_fits_caps_at_the_context_by_default():
    check_fits(60, 10**9, **LIMITS)  # the in-process Engine stops at the context


@pytest.mark.parametrize("prompt_len, max_new_tokens", [(60, 5), (1, 64), (1, 10**9)])
def test_check_fits_without_cap_refuses_tokens_beyond_the_context(prompt_len, max_new_tokens):
    with pytest.raises(RequestTooLargeError) as err:
        check_fits(prompt_len, max_new_tokens, **LIMITS, cap_to_context=False)
    assert (err.value.param, err.value.code) == ("max_new_tokens", "context_length_exceeded")
    assert f"{prompt_len + max_new_tokens} tokens" in str(err.value)


def test_check_fits_without_cap_accepts_exactly_the_context():
    check_fits(60, 4, **LIMITS, cap_to_context=False)
    with pytest.raises(RequestTooLargeError) as err:
        check_fits(64, 0, **LIMITS, cap_to_context=False)
    assert err.value.param == "prompt"
