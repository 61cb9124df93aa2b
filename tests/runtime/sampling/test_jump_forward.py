"""Jump-forward decoding (on by default; `--disable-jump-forward`) on the bundled
SmolLM2-135M: drafting at the token boundary, and constrained outputs with and without it.

The model under the grammar mask often spells forced text with other tokens than its
tokenizer (``{`` ``"`` ``f`` ``ul`` ``l`` for ``{"full``), so the drafts are verified:
the outputs must be exactly those of ordinary constrained decoding (token ids), in fewer
forwards.
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
    with Engine(MODEL, max_total_tokens=4096, disable_jump_forward=True) as plain:
        with Engine(MODEL, max_total_tokens=4096) as jump:
            yield plain, jump


@pytest.fixture(scope="module")
def tokenizer_and_compiler(tokenizer):
    return tokenizer, GrammarCompiler(tokenizer, 49152, [tokenizer.eos_token_id])


def test_draft_at_the_token_boundary(tokenizer_and_compiler):
    import xgrammar as xgr

    tok, compiler = tokenizer_and_compiler
    grammar = compiler.compile("regex", r'\{"name": "[a-z]{1,5}"\}')
    jumper = JumpForward(tok)
    pair, brace = tok.encode('{"', add_special_tokens=False), tok.encode("{")
    # After '{"' (one token) the forced text is 'name": "': drafted as 'name', '":'; the
    # last token ' "' is a strict prefix of longer tokens (' "a', ...) and is left out.
    matcher = xgr.GrammarMatcher(grammar)
    assert len(pair) == 1 and matcher.accept_token(pair[0])
    draft = jumper.draft(matcher, pair, room=100)
    assert draft == tok.encode('name":', add_special_tokens=False)
    assert matcher.find_jump_forward_string() == 'name": "'  # the matcher is unchanged
    assert jumper.draft(matcher, pair, room=1) == draft[:1]
    assert jumper.draft(matcher, pair, room=0) == []
    # After '{' the joint encoding '{"', 'name', ... re-spells '{': the forced text is
    # encoded alone instead.
    matcher = xgr.GrammarMatcher(grammar)
    assert len(brace) == 1 and matcher.accept_token(brace[0])
    assert jumper.draft(matcher, brace, room=100) == tok.encode('"name":', add_special_tokens=False)
    assert jumper.drafted == len(draft) + 1 + len(tok.encode('"name":', add_special_tokens=False))
    free = xgr.GrammarMatcher(compiler.compile("regex", r"[a-z]+"))
    assert jumper.draft(free, brace, room=10) == []


class _Request:
    """A stand-in for the scheduler's request as a spelling's owner (weakly referable)."""


def test_drafts_the_models_own_spelling_once_seen(tokenizer_and_compiler):
    import xgrammar as xgr

    tok, compiler = tokenizer_and_compiler
    grammar = compiler.compile("regex", r'\{"name": "[a-z]{1,5}"\}')
    pair = tok.encode('{"', add_special_tokens=False)
    # the model's spelling of the forced 'name": "', then free text 'ab'
    spelled = tok.convert_tokens_to_ids(["n", "ame", '"', ":", 'Ġ"'])
    free = tok.convert_tokens_to_ids(["ab"])
    by_tokenizer = tok.encode('name":', add_special_tokens=False)
    assert by_tokenizer != spelled[:-1]

    def emit(jumper, owner, tokens, out, matcher):
        drafts = []
        for t in tokens:
            assert matcher.accept_token(t)
            out.append(t)
            drafts.append(jumper.draft(matcher, out, room=100, owner=owner))
        return drafts

    jumper = JumpForward(tok)
    first, out = xgr.GrammarMatcher(grammar), list(pair)
    assert first.accept_token(pair[0])
    # nothing seen yet: the tokenizer's spelling (and its remainders after each token)
    assert jumper.draft(first, out, room=100, owner=(o := _Request())) == by_tokenizer
    emit(jumper, o, spelled + free, out, first)
    # a second request at the same point drafts the first one's tokens, to the end of
    # the forced text (the trailing ' "' included: the model chose it), and after each
    # of them the rest
    owner, second, out = _Request(), xgr.GrammarMatcher(grammar), list(pair)
    assert second.accept_token(pair[0])
    assert jumper.draft(second, out, room=100, owner=owner) == spelled
    assert second.find_jump_forward_string() == 'name": "'  # the matcher is unchanged
    assert jumper.draft(second, out, room=2, owner=owner) == spelled[:2]
    drafts = emit(jumper, owner, spelled[:3], out, second)
    assert drafts == [spelled[1:], spelled[2:], spelled[3:]]
    # tokens emitted several at once (a verified draft) teach the same spelling
    at_once, third, out = JumpForward(tok), xgr.GrammarMatcher(grammar), list(pair)
    assert third.accept_token(pair[0])
    at_once.draft(third, out, room=100, owner=(o := _Request()))
    assert all(third.accept_token(t) for t in spelled + free)
    at_once.draft(third, out + spelled + free, room=100, owner=o)
    fourth = xgr.GrammarMatcher(grammar)
    assert fourth.accept_token(pair[0])
    assert at_once.draft(fourth, list(pair), room=100, owner=_Request()) == spelled
    # a bounded memory: with room for one key only the last boundary's is kept
    small = JumpForward(tok, spellings=1)
    third, out = xgr.GrammarMatcher(grammar), list(pair)
    assert third.accept_token(pair[0])
    assert small.draft(third, out, room=100, owner=(o := _Request())) == by_tokenizer
    emit(small, o, spelled + free, out, third)
    fourth, out = xgr.GrammarMatcher(grammar), list(pair)
    assert fourth.accept_token(pair[0])
    assert small.draft(fourth, out, room=100, owner=_Request()) == by_tokenizer
    assert fourth.accept_token(spelled[0]) and fourth.accept_token(spelled[1])
    assert fourth.accept_token(spelled[2]) and fourth.accept_token(spelled[3])
    assert small.draft(fourth, out + spelled[:4], room=100, owner=_Request()) == spelled[4:]


ORDER = {
    "type": "object",
    "properties": {
        "customer_reference_code": {"type": "string", "maxLength": 12},
        "delivery_priority_level": {"enum": ["standard shipping", "express overnight"]},
        "requires_signature_on_delivery": {"type": "boolean"},
    },
    "required": [
        "customer_reference_code",
        "delivery_priority_level",
        "requires_signature_on_delivery",
    ],
    "additionalProperties": False,
}


def test_a_repeated_schema_drafts_the_spelling_seen_before(engines):
    """The second request of a schema drafts the forced text as the model spelled it in
    the first: fewer forwards, the same tokens as constrained decoding without drafts."""
    plain, jump = engines
    prompt = "Give me a JSON record of a fictional order.\n"
    params = _params("json_schema", ORDER)
    ref = plain.generate(prompt, params)
    first, first_steps = _run(jump, prompt, params)
    second, second_steps = _run(jump, prompt, params)
    assert first["output_ids"] == second["output_ids"] == ref["output_ids"]
    jsonschema.validate(json.loads(second["text"]), ORDER)
    assert second_steps < first_steps
    check_pool(jump.scheduler, idle=True)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_jump_forward_exact_and_fewer_forwards(engines, case):
    plain, jump = engines
    prompt, kind, spec = CASES[case]
    ref, ref_steps = _run(plain, prompt, _params(kind, spec))
    out, steps = _run(jump, prompt, _params(kind, spec))
    assert ref["finish_reason"] == out["finish_reason"] == "stop"
    if kind == "json_schema":
        jsonschema.validate(json.loads(out["text"]), spec)
    else:
        assert re.fullmatch(spec, out["text"])
    assert out["output_ids"] == ref["output_ids"]
    assert out["text"] == ref["text"]
    assert steps < ref_steps
    check_pool(jump.scheduler, idle=True)


def test_jump_forward_counts_tokens_and_streams(engines):
    _, jump = engines
    before = jump.scheduler.stats()["jump_forward_accepted_tokens_total"]
    params = _params("json_schema", NESTED)
    whole = jump.generate(RECORD, params)
    chunks = list(jump.generate(RECORD, params, stream=True))
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert sum((c["output_ids"] for c in chunks), []) == whole["output_ids"]
    jumped = jump.scheduler.stats()["jump_forward_accepted_tokens_total"] - before
    assert jumped > 0
    assert whole["usage"]["completion_tokens"] == len(whole["output_ids"])
    check_pool(jump.scheduler, idle=True)


def test_jump_forward_respects_max_new_tokens_and_stop(engines):
    plain, jump = engines
    for n in (5, 9):
        params = _params("json_schema", PERSON, max_new=n)
        ref, out = plain.generate(RECORD, params), jump.generate(RECORD, params)
        assert out["finish_reason"] == ref["finish_reason"] == "length"
        assert out["output_ids"] == ref["output_ids"] and len(out["output_ids"]) == n
    # "ate" lies inside the forced "Date: ": both runs stop there and cut it off.
    params = _params("regex", DATE, stop=["ate"])
    ref, out = plain.generate(FORMAT, params), jump.generate(FORMAT, params)
    assert out["finish_reason"] == ref["finish_reason"] == "stop"
    assert out["matched_stop"] == ref["matched_stop"] == "ate"
    assert out["text"] == ref["text"] == "D"
    check_pool(jump.scheduler, idle=True)


def test_batched_and_sampled_outputs_are_exact(engines):
    plain, jump = engines
    prompts = [p for p, _, _ in CASES] + [RECORD]
    params = [_params(kind, spec) for _, kind, spec in CASES]
    params += [{"temperature": 0, "max_new_tokens": 24}]  # an unconstrained row alongside
    sampled = [{**_params(kind, spec), "temperature": 0.8, "seed": 7} for _, kind, spec in CASES]
    for batch in (params, sampled + params[-1:]):
        before = _forwards(plain), _forwards(jump)
        refs = plain.generate(prompts, batch)
        outs = jump.generate(prompts, batch)
        assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in refs]
        assert _forwards(jump) - before[1] < _forwards(plain) - before[0]
    check_pool(jump.scheduler, idle=True)


@pytest.fixture(scope="module")
def ngram_engine():
    with Engine(MODEL, max_total_tokens=4096, speculative_algorithm="ngram") as spec:
        yield spec


REPEAT = "one two three four five six seven, one two three four five six seven, one two"
COPY = {
    "type": "object",
    "properties": {"who": {"type": "string", "maxLength": 60}},
    "required": ["who"],
    "additionalProperties": False,
}
BIO = "Bob is a 35-year-old nurse who lives in Paris. " * 2 + "Give the record as JSON.\n"


def test_jump_forward_beside_ngram_speculation(engines, ngram_engine):
    """With the n-gram drafter, constrained rows decode in the plain step with their
    jump-forward drafts and free rows are speculated; every output stays exact."""
    plain, _ = engines
    prompts = [p for p, _, _ in CASES]
    constrained = [_params(kind, spec) for _, kind, spec in CASES]
    free = {"temperature": 0, "max_new_tokens": 48}
    spec = ngram_engine
    assert spec.scheduler.forward_step.drafts is not None
    for batch_prompts, batch in (
        (prompts, constrained),  # constrained only: plain steps with drafts
        ([REPEAT, RECORD], [free, free]),  # free only: speculated
        (prompts + [REPEAT], constrained + [free]),  # both in one batch
    ):
        before = spec.scheduler.stats()
        refs = plain.generate(batch_prompts, batch)
        outs = spec.generate(batch_prompts, batch)
        assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in refs]
        after = spec.scheduler.stats()
        jumped = (
            after["jump_forward_accepted_tokens_total"]
            - before["jump_forward_accepted_tokens_total"]
        )
        verified = after["spec_verify_steps_total"] - before["spec_verify_steps_total"]
        assert (jumped > 0) == ("json_schema" in batch[0] or "regex" in batch[0])
        # the free row of the mixed batch is speculated once the constrained ones end
        assert (verified > 0) == (batch is not constrained)
    check_pool(spec.scheduler, idle=True)


@pytest.mark.parametrize(
    "prompt,grammar,copies",
    [(REPEAT, {"regex": r"[a-z ,]{0,80}"}, True), (BIO, {"json_schema": json.dumps(COPY)}, False)],
)
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 3}])
def test_constrained_rows_verify_ngram_lookups(
    engines, ngram_engine, prompt, grammar, copies, sampling
):
    """Under n-gram speculation a greedy constrained row where the grammar forces
    nothing drafts the prompt lookup's continuation, cut where the grammar rejects it,
    and verifies it in the plain step: the output equals plain constrained decoding, in
    fewer forwards than jump-forward alone where the output copies the prompt. Sampled
    rows draft no lookups (their draws must not meet an extend row's rounding)."""
    plain, jump = engines
    params = {"max_new_tokens": 48, **grammar, **sampling}
    before = ngram_engine.scheduler.stats()
    ref = plain.generate(prompt, params)
    _, jump_steps = _run(jump, prompt, params)
    out, steps = _run(ngram_engine, prompt, params)
    assert out["output_ids"] == ref["output_ids"]
    after = ngram_engine.scheduler.stats()
    drafted, kept = (
        after[k] - before[k]
        for k in (
            "constrained_lookup_draft_tokens_total",
            "constrained_lookup_accepted_tokens_total",
        )
    )
    assert 0 <= kept <= drafted and (drafted > 0) == (sampling["temperature"] == 0)
    if copies and sampling["temperature"] == 0:  # greedy continues the repeated text
        assert kept > 0 and steps < jump_steps
    check_pool(ngram_engine.scheduler, idle=True)
