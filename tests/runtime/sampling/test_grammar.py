"""Grammar compiler and backend on a tiny raw vocabulary (no model)."""

from __future__ import annotations

import json

import pytest
import torch

from radixlm.errors import InvalidRequestError, ServerError
from radixlm.runtime.sampling.grammar import GrammarBackend, GrammarCompiler, grammar_spec
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sampling.schema_refs import structural_tag_ref, unresolvable_ref
from radixlm.runtime.sched.request import Req

EOS = 0
VOCAB = ["<eos>", "{", "}", '"', "a", "b", ":", ",", " ", "1", "2", "ab", '{"a"', "yes", "no", "x"]
LOGITS_WIDTH = 20  # wider than the vocabulary, as a model's padded logits can be


@pytest.fixture
def compiler() -> GrammarCompiler:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(VOCAB, vocab_size=LOGITS_WIDTH, stop_token_ids=[EOS])
    return GrammarCompiler(None, LOGITS_WIDTH, [EOS], max_entries=2, tokenizer_info=info)


class _Gated:
    """The compiler's compiles recorded (`calls`), "a+" held at `gate` once `started`."""

    def __init__(self, compiler, monkeypatch):
        import threading

        self.gate, self.started, self.calls = threading.Event(), threading.Event(), []
        real = compiler._compile

        def slow(kind, spec):
            self.calls.append(spec)
            if spec == "a+":
                self.started.set()
                assert self.gate.wait(30)
            return real(kind, spec)

        monkeypatch.setattr(compiler, "_compile", slow)


@pytest.fixture
def gated(compiler, monkeypatch) -> _Gated:
    return _Gated(compiler, monkeypatch)


def _req(**grammar) -> Req:
    params = SamplingParams.from_any({"temperature": 0, **grammar})
    return Req(rid="r", input_ids=[1], params=params)


def _allowed(compiler, **grammar) -> list[list[str]]:
    """Tokens allowed at each step of greedy decoding over a fixed preference order."""
    backend = GrammarBackend(compiler)
    req = _req(**grammar)
    backend.prepare(req)
    steps = []
    for _ in range(20):
        logits = torch.arange(LOGITS_WIDTH, dtype=torch.float32)[None, :].flip(-1).clone()
        backend.apply(logits, [req])
        allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
        steps.append([VOCAB[t] for t in allowed])
        tok = int(torch.argmax(logits[0]))
        req.output_ids.append(tok)
        if backend.accept(req, tok):
            return steps
    raise AssertionError("grammar did not terminate")


def test_ebnf_masks_then_terminates_on_eos(compiler):
    steps = _allowed(compiler, ebnf='root ::= "yes" | "no"')
    assert steps == [["yes", "no"], ["<eos>"]]


def test_regex_drives_greedy_output(compiler):
    backend = GrammarBackend(compiler)
    req = _req(regex="(ab)+x")
    backend.prepare(req)
    # Preference: "x" first, then "a": the grammar forces "ab"/"a" before any "x".
    prefer = torch.full((LOGITS_WIDTH,), -5.0)
    prefer[VOCAB.index("x")], prefer[VOCAB.index("a")] = 3.0, 2.0
    prefer[16:] = 10.0  # padding ids beyond the vocabulary must be masked too
    out = []
    for _ in range(10):
        logits = prefer.clone()[None, :]
        backend.apply(logits, [req])
        tok = int(torch.argmax(logits[0]))
        out.append(tok)
        req.output_ids.append(tok)
        if backend.accept(req, tok):
            break
    assert [VOCAB[t] for t in out] == ["a", "b", "x", "<eos>"]
    assert req.matched_stop == EOS


def test_json_schema_output_parses(compiler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    backend = GrammarBackend(compiler)
    req = _req(json_schema=json.dumps(schema))
    backend.prepare(req)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        logits = torch.randn(1, LOGITS_WIDTH, generator=gen)
        backend.apply(logits, [req])
        tok = int(torch.argmax(logits[0]))
        req.output_ids.append(tok)
        if backend.accept(req, tok):
            break
    assert req.output_ids[-1] == EOS
    text = "".join(VOCAB[t] for t in req.output_ids[:-1])
    assert isinstance(json.loads(text)["a"], int)


def test_mixed_batch_leaves_unconstrained_rows_untouched(compiler):
    backend = GrammarBackend(compiler)
    free, bound, free2 = _req(), _req(ebnf='root ::= "no"'), _req()
    backend.prepare(free)
    backend.prepare(bound)
    assert free.grammar is None and bound.grammar is not None
    logits = torch.randn(3, LOGITS_WIDTH)
    before = logits.clone()
    backend.apply(logits, [free, bound, free2])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [VOCAB.index("no")]
    assert backend.accept(free, 5) is False  # unconstrained: never ends by grammar


def test_unconstrained_batch_costs_no_mask(compiler):
    backend = GrammarBackend(compiler)
    logits = torch.randn(2, LOGITS_WIDTH)
    before = logits.clone()
    backend.apply(logits, [_req(), _req()])
    assert torch.equal(logits, before)
    assert backend._bitmask is None and compiler._compiler is None  # nothing built


def test_compile_cache_hits_and_evicts(compiler):
    a = compiler.compile("regex", "ab")
    assert compiler.compile("regex", "ab") is a
    compiler.compile("regex", "b")
    compiler.compile("regex", "x")  # max_entries=2: "ab" is evicted
    assert ("regex", "ab") not in compiler._cache
    assert compiler.compile("regex", "ab") is not a


@pytest.mark.parametrize(
    "kind, spec, message",
    [
        ("json_schema", "{not json", "json_schema is not valid JSON"),
        ("json_schema", "[1]", "must be a JSON object"),
        ("json_schema", '{"type": 5}', "not a valid JSON schema at type"),
        ("json_schema", '{"minLength": -1}', "not a valid JSON schema at minLength"),
        ("regex", "[a-", "invalid regex: Regex parsing error"),
        (
            "ebnf",
            "root ::= foo",
            'invalid ebnf: EBNF parser error at line 1, column 10: Rule "foo"',
        ),
        ("structural_tag", "{}", "invalid structural_tag"),
    ],
)
def test_invalid_specs_raise_and_are_cached(compiler, kind, spec, message):
    for _ in range(2):  # the second raise comes from the cache
        with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(")):
            compiler.compile(kind, spec)
    assert isinstance(compiler._cache[(kind, spec)], InvalidRequestError)


def test_prepare_raises_for_bad_grammar(compiler):
    with pytest.raises(InvalidRequestError, match="invalid regex"):
        GrammarBackend(compiler).prepare(_req(regex="(("))


def test_at_most_one_grammar_field():
    with pytest.raises(InvalidRequestError, match="at most one of json_schema, regex"):
        SamplingParams.from_any({"json_schema": "{}", "regex": "a"})
    with pytest.raises(InvalidRequestError, match="invalid sampling parameters"):
        SamplingParams.from_any({"regex": 3})
    assert grammar_spec(SamplingParams(ebnf="root ::= x")) == ("ebnf", "root ::= x")
    assert grammar_spec(SamplingParams()) is None


def test_a_compile_blocks_no_other_spec_and_is_shared(compiler, gated):
    """While one spec compiles, another compiles and a cache lookup answers at once; a
    second caller of the compiling spec waits for that compile instead of repeating it."""
    import threading

    gate, started, calls = gated.gate, gated.started, gated.calls
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(compiler.compile("regex", "a+")))
        for _ in range(2)
    ]
    threads[0].start()
    assert started.wait(30)
    threads[1].start()
    assert compiler.cached("regex", "a+") is None  # no wait on the compile under way
    assert compiler.compile("regex", "b+") is not None  # another spec compiles meanwhile
    assert compiler.cached("regex", "b+") is not None
    gate.set()
    for t in threads:
        t.join(30)
    assert len(results) == 2 and results[0] is results[1]
    assert calls.count("a+") == 1


def test_validate_gives_up_after_the_timeout_and_caches_the_late_result(compiler, gated):
    """A compile longer than `compile_timeout` is refused (code grammar_compile_timeout)
    while it goes on, and its late result is cached as that refusal: the spec is refused
    at once when sent again, and never reaches the scheduler."""
    import threading

    gate, calls = gated.gate, gated.calls
    compiler.compile_timeout = 0.05
    for _ in range(2):  # the second request joins the compile under way
        with pytest.raises(InvalidRequestError, match="did not compile within 0.05 s") as err:
            compiler.validate(SamplingParams(regex="a+"))
        assert err.value.param == "regex" and err.value.code == "grammar_compile_timeout"
    compiler.validate(SamplingParams(regex="b+"))  # a quick spec is unaffected
    gate.set()
    for _ in range(200):  # until the late compile is cached
        if ("regex", "a+") in compiler._cache:
            break
        threading.Event().wait(0.05)
    with pytest.raises(InvalidRequestError, match="did not compile within") as err:
        compiler.cached("regex", "a+")
    assert err.value.code == "grammar_compile_timeout"
    with pytest.raises(InvalidRequestError, match="did not compile within"):
        compiler.validate(SamplingParams(regex="a+"))
    assert calls == ["a+", "b+"]


def test_timed_compiles_run_a_bounded_few_at_once(compiler, gated):
    """`validate`'s compiles hold at most TIMED_COMPILES threads compiling; a spec that
    gets no turn within the timeout is refused as the server's (ServerError: busy, retry)
    without being compiled or cached."""
    import threading

    gate, started, calls = gated.gate, gated.started, gated.calls
    compiler._timed = threading.BoundedSemaphore(1)
    compiler.compile_timeout = 0.05
    with pytest.raises(InvalidRequestError, match="did not compile within"):
        compiler.validate(SamplingParams(regex="a+"))
    assert started.wait(30)  # "a+" holds the only slot
    with pytest.raises(ServerError, match="no grammar compile thread came free"):
        compiler.validate(SamplingParams(regex="b+"))
    for _ in range(200):  # until "b+" gives up waiting for the slot
        if ("regex", "b+") not in compiler._inflight:
            break
        threading.Event().wait(0.05)
    assert calls == ["a+"] and ("regex", "b+") not in compiler._cache
    assert ("regex", "b+") not in compiler._inflight
    gate.set()
    compiler.compile_timeout = 10
    compiler.validate(SamplingParams(regex="b+"))
    assert calls == ["a+", "b+"]


def test_no_time_limit_compiles_on_the_callers_thread(compiler):
    import threading

    compiler.compile_timeout = None
    seen = []
    real = compiler._compile
    compiler._compile = lambda kind, spec: (
        seen.append(threading.current_thread()),
        real(kind, spec),
    )[1]
    compiler.validate(SamplingParams(regex="ab"))
    assert seen == [threading.current_thread()]
    assert GrammarCompiler(None, 2, [0], compile_timeout=0).compile_timeout is None


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), 1e10])
def test_grammar_compile_timeout_flag_range(value):
    from radixlm.config import ServerArgs

    with pytest.raises(ValueError, match="grammar_compile_timeout"):
        ServerArgs(grammar_compile_timeout=value)
    assert ServerArgs(grammar_compile_timeout=0).grammar_compile_timeout == 0


def test_a_spec_over_the_size_limit_is_refused_before_compiling(compiler, monkeypatch):
    from radixlm.runtime.sampling.grammar import MAX_SPEC_CHARS

    monkeypatch.setattr(compiler, "_compile", lambda kind, spec: pytest.fail("compiled"))
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_SPEC_CHARS}") as err:
        compiler.compile("regex", "a" * (MAX_SPEC_CHARS + 1))
    assert err.value.param == "regex"
    assert not compiler._cache and not compiler._inflight


def test_a_slow_scheduler_compile_holds_back_no_other_request(compiler, gated):
    """The scheduler's compile pool never has a worker wait for another's compile: many
    requests of one slow new spec, then one of another spec, which gets its matcher
    while the slow one still compiles (once)."""

    gate, calls = gated.gate, gated.calls
    backend = GrammarBackend(compiler)
    slow_reqs = [_req(regex="a+") for _ in range(8)]
    slow_jobs = [backend.start(r) for r in slow_reqs]
    quick = _req(regex="b+")
    quick_job = backend.start(quick)
    quick_job.result(timeout=10)  # no worker is tied up waiting for "a+"
    backend.finish(quick, quick_job)
    assert quick.grammar is not None and not any(j.done() for j in slow_jobs)
    gate.set()
    for r, j in zip(slow_reqs, slow_jobs, strict=True):
        backend.finish(r, j)
        assert r.grammar is not None
    assert calls == ["a+", "b+"]


@pytest.mark.parametrize(
    "schema, ref",
    [
        (
            {"properties": {"a": {"$ref": "http://example.com/int.json"}}},
            "http://example.com/int.json",
        ),
        ({"prefixItems": [{"$ref": "other.json#/x"}]}, "other.json#/x"),
        ({"$defs": {"n": {"$anchor": "n", "type": "integer"}}, "items": {"$ref": "#n"}}, "#n"),
        ({"anyOf": [{"type": "null"}, {"not": {"$ref": "n.json"}}]}, "n.json"),
        (  # a local pointer's target is walked, wherever it is
            {
                "components": {"schemas": {"X": {"properties": {"b": {"$ref": "http://e/b"}}}}},
                "properties": {"a": {"$ref": "#/components/schemas/X"}},
            },
            "http://e/b",
        ),
        ({"$defs": {"u": {"$ref": "http://e/u"}}, "type": "integer"}, None),  # never reached
        ({"$defs": {"n": {"items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}, None),
        ({"properties": {"default": {"$ref": "http://x/d.json"}}}, "http://x/d.json"),
        ({"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}, None),
        ({"type": "array", "items": {"$ref": "#"}}, None),
        ({"properties": {"$ref": {"type": "string"}}}, None),  # a property named "$ref"
        ({"enum": [{"$ref": "http://example.com"}]}, None),  # data, not a reference
        ({"x-vendor": {"$ref": "http://example.com"}, "examples": [{"$ref": "y"}]}, None),
    ],
)
def test_references_a_grammar_cannot_follow(schema, ref):
    assert unresolvable_ref(schema) == ref


def test_a_schema_with_an_unresolvable_reference_is_refused(compiler):
    schema = {"type": "object", "properties": {"a": {"$ref": "http://example.com/a.json"}}}
    with pytest.raises(InvalidRequestError, match="only references inside a schema") as err:
        compiler.compile("json_schema", json.dumps(schema))
    assert err.value.param == "json_schema"
    local = {"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}
    assert compiler.compile("json_schema", json.dumps(local)) is not None


def test_a_structural_tag_with_an_unresolvable_reference_is_refused(compiler):
    fmt = {"type": "json_schema", "json_schema": {"properties": {"a": {"$ref": "http://e/a"}}}}
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [fmt]}}
    with pytest.raises(InvalidRequestError, match="'http://e/a'") as err:
        compiler.compile("structural_tag", json.dumps(tag))
    assert err.value.param == "structural_tag"
    assert structural_tag_ref(tag) == "http://e/a"
    fmt["json_schema"] = {"properties": {"a": {"type": "integer"}}}
    assert structural_tag_ref(tag) is None


def test_a_compile_that_cannot_start_leaves_nothing_in_flight(compiler):
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        compiler.submit("regex", "ab", pool)
    assert not compiler._inflight
    assert compiler.compile("regex", "ab") is not None


def test_validate_without_wait_only_looks_up(compiler, monkeypatch):
    """The tokenizer manager's check on its event loop: a cached refusal raises, a spec
    not cached passes without compiling."""
    monkeypatch.setattr(compiler, "_compile", lambda kind, spec: pytest.fail("compiled"))
    compiler.validate(SamplingParams(regex="a+"), wait=False)
    compiler._cache[("regex", "((")] = InvalidRequestError("invalid regex", param="regex")
    with pytest.raises(InvalidRequestError, match="invalid regex"):
        compiler.validate(SamplingParams(regex="(("), wait=False)
