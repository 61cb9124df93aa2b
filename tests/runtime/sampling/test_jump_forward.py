"""Jump-forward decoding (`--enable-jump-forward`) on the bundled SmolLM2-135M: the
boundary re-tokenization, and greedy constrained outputs with and without it.

Exactness: the jumped tokens are the tokenizer's encoding of the forced text, while the
model under the grammar mask often spells the same text with other tokens (``{`` ``"``
``f`` ``ul`` ``l`` for ``{"full``); the tokens then differ, and so can the free text the
model writes after them. The equal-text cases below are the grammars and prompts where
the free text does not change (checked against ordinary decoding in the same test);
every case must stay valid, finish the same way and take fewer forward steps.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm import Engine
from radixlm.runtime.sampling.grammar import GrammarCompiler
from radixlm.runtime.sampling.jump_forward import JumpForward
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool

PERSON = {
    "type": "object",
    "properties": {
        "full_name_of_the_person": {"type": "string", "maxLength": 20},
        "age_in_years": {"type": "integer"},
        "is_employed_currently": {"type": "boolean"},
    },
    "required": ["full_name_of_the_person", "age_in_years", "is_employed_currently"],
    "additionalProperties": False,
}
ENUMS = {
    "type": "object",
    "properties": {
        "color": {"enum": ["crimson red", "forest green", "navy blue"]},
        "size": {"type": "string", "enum": ["small", "medium", "large"]},
    },
    "required": ["color", "size"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {
                "first_name": {"type": "string", "maxLength": 12},
                "address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 12},
                        "zip_code": {"type": "integer"},
                    },
                    "required": ["city", "zip_code"],
                    "additionalProperties": False,
                },
            },
            "required": ["first_name", "address"],
            "additionalProperties": False,
        }
    },
    "required": ["user"],
    "additionalProperties": False,
}
DATE = r"Date: [0-9]{4}-[0-9]{2}-[0-9]{2}, Temperature: -?[0-9]{1,2} degrees Celsius"
PHONE = r"\(555\) [0-9]{3}-[0-9]{4} extension [0-9]{2}"
RECORD = "Give me a JSON record of a fictional person.\n"
FORMAT = "Answer in the requested format.\n"

# (prompt, grammar kind, spec, schema or regex to validate with)
CASES = [
    (RECORD, "json_schema", PERSON),
    (FORMAT, "json_schema", PERSON),
    (RECORD, "json_schema", ENUMS),
    (RECORD, "json_schema", NESTED),
    (FORMAT, "regex", DATE),
    (RECORD, "regex", PHONE),
]
SAME_TEXT = {1, 3}  # indices into CASES whose text jump-forward leaves unchanged


def _params(kind, spec, max_new=96, **extra) -> dict:
    value = json.dumps(spec) if kind == "json_schema" else spec
    return {"temperature": 0, "max_new_tokens": max_new, kind: value, **extra}


def _forwards(engine) -> int:
    c = engine.scheduler.counters
    return c.extend_steps + c.decode_steps


def _run(engine, prompt, params) -> tuple[dict, int]:
    before = _forwards(engine)
    out = engine.generate(prompt, params)
    return out, _forwards(engine) - before


@pytest.fixture(scope="module")
def engines():
    with Engine(MODEL, max_total_tokens=4096) as plain:
        with Engine(MODEL, max_total_tokens=4096, enable_jump_forward=True) as jump:
            yield plain, jump


@pytest.fixture(scope="module")
def tokenizer_and_compiler(tokenizer):
    return tokenizer, GrammarCompiler(tokenizer, 49152, [tokenizer.eos_token_id])


def test_boundary_retokenization_respells_the_sampled_token(tokenizer_and_compiler):
    import xgrammar as xgr

    tok, compiler = tokenizer_and_compiler
    grammar = compiler.compile("regex", r'\{"name": "[a-z]{1,5}"\}')
    matcher = xgr.GrammarMatcher(grammar)
    brace = tok.encode("{", add_special_tokens=False)
    assert len(brace) == 1 and matcher.accept_token(brace[0])
    jumper = JumpForward(tok)
    replace, ids = jumper.continuation(matcher, brace[0], room=100)
    # '{' + '"name": "' encodes as '{"', 'name', '":', ' "'; the last is a strict prefix
    # of longer tokens (' "a', ...), so the model writes it.
    assert replace
    assert ids == tok.encode('{"name":', add_special_tokens=False)
    assert matcher.find_jump_forward_string() == ' "'
    fresh = xgr.GrammarMatcher(grammar)  # the matcher holds exactly the new spelling
    assert all(fresh.accept_token(t) for t in ids)
    assert (jumper.jumps, jumper.tokens) == (1, len(ids))


def test_room_limits_and_nothing_forced(tokenizer_and_compiler):
    import xgrammar as xgr

    tok, compiler = tokenizer_and_compiler
    grammar = compiler.compile("regex", r'\{"name": "[a-z]{1,5}"\}')
    jumper = JumpForward(tok)
    matcher = xgr.GrammarMatcher(grammar)
    assert jumper.continuation(matcher, None, room=2) == (False, tok.encode('{"name'))
    assert jumper.continuation(matcher, None, room=0) == (False, [])
    free = xgr.GrammarMatcher(compiler.compile("regex", r"[a-z]+"))
    assert jumper.continuation(free, None, room=10) == (False, [])


@pytest.mark.parametrize("case", range(len(CASES)))
def test_jump_forward_valid_and_fewer_steps(engines, case):
    plain, jump = engines
    prompt, kind, spec = CASES[case]
    ref, ref_steps = _run(plain, prompt, _params(kind, spec))
    out, steps = _run(jump, prompt, _params(kind, spec))
    assert ref["finish_reason"] == out["finish_reason"] == "stop"
    if kind == "json_schema":
        jsonschema.validate(json.loads(out["text"]), spec)
    else:
        assert re.fullmatch(spec, out["text"])
    assert steps < ref_steps
    if case in SAME_TEXT:
        assert out["text"] == ref["text"]
    check_pool(jump.scheduler, idle=True)


def test_jump_forward_counts_tokens_and_streams(engines):
    _, jump = engines
    before = jump.scheduler.stats()["jump_forward_tokens_total"]
    params = _params("json_schema", NESTED)
    whole = jump.generate(RECORD, params)
    chunks = list(jump.generate(RECORD, params, stream=True))
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert sum((c["output_ids"] for c in chunks), []) == whole["output_ids"]
    jumped = jump.scheduler.stats()["jump_forward_tokens_total"] - before
    assert jumped > 0
    assert whole["usage"]["completion_tokens"] == len(whole["output_ids"])
    check_pool(jump.scheduler, idle=True)


def test_jump_forward_respects_max_new_tokens_and_stop(engines):
    plain, jump = engines
    out = jump.generate(RECORD, _params("json_schema", PERSON, max_new=5))
    assert out["finish_reason"] == "length"
    assert len(out["output_ids"]) == 5
    # "ate" lies inside the forced "Date: ": both runs stop there and cut it off.
    params = _params("regex", DATE, stop=["ate"])
    ref, out = plain.generate(FORMAT, params), jump.generate(FORMAT, params)
    assert out["finish_reason"] == ref["finish_reason"] == "stop"
    assert out["matched_stop"] == ref["matched_stop"] == "ate"
    assert out["text"] == ref["text"] == "D"
    check_pool(jump.scheduler, idle=True)
