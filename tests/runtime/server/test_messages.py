"""The wire schema: every message survives msgpack round trips as its own type."""

from __future__ import annotations

import msgspec
import pytest

from radixlm.runtime.sampling.logprobs import LogprobOptions, TokenLogprobs
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.server import messages as m

SAMPLES = [
    m.GenerateReq(
        rid="a",
        input_ids=[1, 2, 3],
        params=SamplingParams(max_new_tokens=5, temperature=0.0, stop=["\n\n"], seed=7),
        extra_key="salt",
    ),
    m.AbortReq("a"),
    m.Heartbeat("scheduler", 12, 0.25),
    m.FlushCacheReq("f"),
    m.GetInfoReq("i"),
    m.ControlResp("i", True, info={"memory": {"free": 3}}),
    m.ReqError(rid="a", kind="queue_full", message="queue full"),
    m.ReqError(rid="b", kind="invalid_request", message="bad", param="top_k", code="invalid_value"),
    m.BatchTokenOut(
        ["a", "b"], [[5], []], [None, "stop"], [None, "END"], [3, 4], [1, 2], [0, 4], [[], ["END"]]
    ),
    m.BatchStrOut(["a"], [[5]], ["length"], [2], [3], [1], [0], ["hi"], queue_times=[0.5]),
    m.GenerateReq(
        rid="b",
        input_ids=[4],
        params=SamplingParams(logit_bias={7: -1.5}, frequency_penalty=0.5, no_stop_trim=True),
        logprobs=LogprobOptions(return_logprob=True, logprob_start_len=0, top_logprobs_num=2),
    ),
    m.BatchTokenOut(
        ["a", "b"],
        [[5], [6]],
        [None, None],
        [None, None],
        [3, 4],
        [1, 1],
        [0, 0],
        [[], []],
        no_stop_trim=[False, True],
        output_logprobs=[None, TokenLogprobs([-0.5], [6], [[-0.5, -1.0]], [[6, 9]])],
        input_logprobs=[None, TokenLogprobs([None, -2.0], [1, 4])],
    ),
    m.ProcessReady("scheduler", {"vocab_size": 10}),
    m.ProcessFailed("scheduler", "Traceback ..."),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip_keeps_type_and_fields(msg):
    back = m.decode(m.encode(msg))
    assert type(back) is type(msg)
    assert back == msg


def test_garbage_is_a_decode_error_not_pickle():
    with pytest.raises(msgspec.DecodeError):
        m.decode(b"\x80\x04\x95not-msgpack")
    with pytest.raises(msgspec.ValidationError):
        m.decode(msgspec.msgpack.encode({"type": "no-such-tag"}))
