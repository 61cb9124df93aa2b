"""Grammar-constrained decoding through the Engine on the bundled model: mixed batches,
retraction, streaming abort, and refusals."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm import Engine
from radixlm.errors import InvalidRequestError
from tests.runtime.conftest import MAX_NEW, MODEL, greedy
from tests.runtime.sched_helpers import check_pool

SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "maxLength": 8},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["word", "n", "ok"],
    "additionalProperties": False,
}
DIGITS = r"[0-9]{2,4}(-[0-9]{2,4}){1,2}"


def _constrained(schema=SMALL_SCHEMA, **extra) -> dict:
    return {**greedy(48), "json_schema": json.dumps(schema), **extra}


def _check_json(out: dict, schema=SMALL_SCHEMA) -> None:
    assert out["finish_reason"] == "stop", out
    jsonschema.validate(json.loads(out["text"]), schema)


@pytest.fixture(scope="module")
def engine():
    with Engine(MODEL, max_total_tokens=4096) as e:
        yield e


def test_mixed_batch_unconstrained_rows_stay_exact(engine, prompts, reference):
    batch = [prompts[0], prompts[6], prompts[1], prompts[7]]
    params = [greedy(), _constrained(), greedy(), {**greedy(24), "regex": DIGITS}]
    outs = engine.generate(input_ids=batch, sampling_params=params)
    assert outs[0]["output_ids"] == reference[0][:MAX_NEW]
    assert outs[2]["output_ids"] == reference[1][:MAX_NEW]
    _check_json(outs[1])
    assert outs[3]["finish_reason"] == "stop" and re.fullmatch(DIGITS, outs[3]["text"])
    # A grammar run ends with EOS, which the grammar allows only once it is complete.
    assert outs[1]["output_ids"][-1] == outs[1]["matched_stop"] == 2
    check_pool(engine.scheduler, idle=True)


def test_sampled_outputs_always_valid(engine, prompts):
    params = [_constrained(temperature=1.0, seed=s) for s in range(4)]
    for out in engine.generate(input_ids=[prompts[6]] * 4, sampling_params=params):
        _check_json(out)


def test_ebnf_and_ignore_eos(engine, prompts):
    ebnf = 'root ::= "The answer is " ("yes" | "no") "."'
    out = engine.generate(input_ids=prompts[7], sampling_params={**greedy(20), "ebnf": ebnf})
    assert out["text"] in ("The answer is yes.", "The answer is no.")
    # With ignore_eos the grammar still ends the request once it terminates.
    out2 = engine.generate(
        input_ids=prompts[7], sampling_params={**greedy(20), "ebnf": ebnf, "ignore_eos": True}
    )
    assert (out2["text"], out2["finish_reason"]) == (out["text"], "stop")


def test_retraction_keeps_matcher_state(prompts):
    """Six constrained requests in a 96-slot pool: decode runs out of slots and retracts;
    the resumed requests produce exactly what they produce in a large pool."""
    batch = [prompts[i] for i in (0, 1, 2, 3, 4, 0)]
    params = [_constrained(seed=s) for s in range(6)]
    with Engine(MODEL, max_total_tokens=4096) as big:
        expected = big.generate(input_ids=batch, sampling_params=params)
    with Engine(MODEL, max_total_tokens=96, schedule_conservativeness=0.3) as small:
        outs = small.generate(input_ids=batch, sampling_params=params)
        assert small.get_server_info()["scheduler"]["num_retracted_total"] > 0
        check_pool(small.scheduler, idle=True)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in expected]
    for out in outs:
        _check_json(out)


def test_abort_constrained_stream_frees_everything(engine, prompts):
    stream = engine.generate(input_ids=prompts[6], sampling_params=_constrained(), stream=True)
    first = next(stream)
    assert first["index"] == 0
    stream.close()
    assert not engine.scheduler.running and not engine.scheduler.waiting
    check_pool(engine.scheduler, idle=True)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"regex": "[a-"}, "invalid regex"),
        ({"json_schema": '{"type": "strin"}'}, "not a valid JSON schema"),
        ({"ebnf": "root ::= x"}, "invalid ebnf"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "at most one"),
    ],
)
def test_bad_grammar_queues_nothing(engine, bad, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.generate(["fine", "bad"], [greedy(4), {**greedy(4), **bad}])
    assert not engine.scheduler.waiting and not engine.scheduler.running


def test_compiling_grammar_does_not_hold_up_the_running_requests(engine, prompts, reference):
    """A grammar not in the cache compiles on a worker thread: the scheduler keeps
    stepping the other requests meanwhile, then admits the constrained one, whose output
    is valid; a request aborted while compiling ends at once with its KV untouched."""
    import threading

    from tests.runtime.sched_helpers import make_req, run_all, step, tokens

    sched = engine.scheduler
    gate = threading.Event()
    compile_ = sched.grammars.compiler._compile

    def gated(kind, spec):
        assert gate.wait(60)
        return compile_(kind, spec)

    schema = {**SMALL_SCHEMA, "title": "gated"}  # not in the compiler's cache
    engine.scheduler.grammars.compiler._compile = gated
    try:
        plain = make_req(prompts[0], MAX_NEW)
        constrained = make_req(prompts[6], 48, json_schema=json.dumps(schema))
        dropped = make_req(prompts[6], 48, json_schema=json.dumps({**schema, "title": "x"}))
        for req in (plain, constrained, dropped):
            sched.add_request(req)
        assert [r for r, _ in sched.compiling] == [constrained, dropped]
        outs: dict = {}
        while not any(o.finish_reason for o in outs.get(plain.rid, [])):
            step(sched, outs)  # the plain request runs to the end while the gate is shut
        assert tokens(outs[plain.rid]) == reference[0][:MAX_NEW]
        assert sched.abort(dropped.rid)
        assert constrained.rid not in outs and len(sched.compiling) == 1
        gate.set()
        while sched.compiling:
            step(sched, outs)
        run_all(sched, outs)
    finally:
        engine.scheduler.grammars.compiler._compile = compile_
        gate.set()
    assert [o.finish_reason for o in outs[dropped.rid]] == ["abort"]
    text = engine.tokenizer.decode(tokens(outs[constrained.rid]), skip_special_tokens=True)
    jsonschema.validate(json.loads(text), schema)
    check_pool(sched, idle=True)
