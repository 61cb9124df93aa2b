"""The interpreter on a model-free backend: text, roles, variables, defaults, forks,
joins, var scopes, streaming, concurrency and error handling."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

import radixlm as rl
from radixlm.errors import InvalidRequestError
from radixlm.lang.ir import INT_REGEX
from tests.lang.fake_backend import FakeBackend

WAIT_S = 60  # generous bound on event waits, so a broken implementation fails, not hangs


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


def test_text_roles_and_messages(fake):
    @rl.function
    def chat(s, question):
        s += rl.system("Be brief.")
        with s.user():
            s += question
        s += rl.assistant(rl.gen("answer", max_tokens=5))
        s += "tail"

    state = chat.run(question="Why?", backend=fake)
    assert state["answer"] == "<5>"
    assert state.text() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhy?<|im_end|>\n"
        "<|im_start|>assistant\n<5><|im_end|>\ntail"
    )
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<5>"},
    ]
    # The gen's prompt is the whole text before it, assistant marker included.
    assert fake.prompts_of() == [state.text()[: state.text().index("<5>")]]


def test_role_methods_begin_end_and_empty_role(fake):
    @rl.function
    def prog(s):
        s.system("S")
        s += rl.user_begin() + "U" + rl.user_end()
        s += rl.assistant_begin()
        s += rl.gen("a", max_tokens=2)
        s += rl.assistant_end()
        s += rl.user()

    text = prog.run(backend=fake).text()
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n<2><|im_end|>\n<|im_start|>user\n<|im_end|>\n"
    )


def test_nested_role_is_an_error(fake):
    @rl.function
    def prog(s):
        s += rl.user_begin()
        s += rl.assistant("x")

    state = prog.run(backend=fake)
    assert isinstance(state.error(), ValueError)
    with pytest.raises(ValueError, match="opened inside role"):
        state.text()


def test_gen_inherits_run_defaults_and_overrides(fake):
    @rl.function
    def prog(s):
        s += "a" + rl.gen("x")
        s += rl.gen("y", max_tokens=3, temperature=0.5, stop="\n", top_k=4)
        s += rl.gen_int("n")
        s += rl.gen("j", json_schema={"type": "object"})

    state = prog.run(backend=fake, max_new_tokens=7, temperature=0, stop=["END"])
    assert state["x"] == "<7>" and state["y"] == "<3>"
    state.sync()  # the program runs on in the background: wait for its last gen call
    params = [c["sampling_params"] for k, c in fake.calls]
    assert params[0] == {"max_new_tokens": 7, "temperature": 0, "stop": ["END"]}
    assert params[1] == {"max_new_tokens": 3, "temperature": 0.5, "top_k": 4, "stop": ["\n"]}
    assert params[2] == {"max_new_tokens": 7, "temperature": 0, "stop": ["END"], "regex": INT_REGEX}
    assert json.loads(params[3]["json_schema"]) == {"type": "object"}


def test_gen_argument_errors_at_call_site():
    with pytest.raises(ValueError, match="dtype"):
        rl.gen("x", dtype=list)
    with pytest.raises(ValueError, match="at most one"):
        rl.gen("x", regex="a", ebnf="b")
    with pytest.raises(ValueError, match="fork"):
        rl.gen("x", n=2)
    with pytest.raises(ValueError, match="non-empty"):
        rl.select("x", choices=[])
    with pytest.raises(ValueError, match="non-empty"):
        rl.select("x", choices=["a", ""])
    with pytest.raises(TypeError):
        rl.select("x", choices=["a", 3])


def test_code_runs_until_a_variable_is_read(fake):
    started, release = threading.Event(), threading.Event()
    reached = threading.Event()

    def hook(kind, payload):
        started.set()
        assert release.wait(WAIT_S)

    fake.on_request = hook

    @rl.function
    def prog(s):
        s += "x" + rl.gen("a", max_tokens=1)
        reached.set()  # runs while the gen is still in flight

    state = prog.run(backend=fake)
    assert started.wait(WAIT_S) and reached.is_set()
    release.set()
    assert state["a"] == "<1>"


def test_run_batch_issues_requests_concurrently(fake):
    n = 6
    barrier = threading.Barrier(n, timeout=WAIT_S)

    def hook(kind, payload):
        if payload["sampling_params"]["max_new_tokens"] == 4:
            barrier.wait()  # only passes when all n gens are in flight at once

    fake.on_request = hook

    @rl.function
    def prog(s, i):
        s += f"item {i}: " + rl.gen("out", max_tokens=4)

    states = prog.run_batch([{"i": i} for i in range(n)], backend=fake, num_threads=n)
    assert [s.error() for s in states] == [None] * n
    assert [s["out"] for s in states] == ["<4>"] * n


def test_errors_surface_and_do_not_stop_other_programs(fake):
    @rl.function
    def prog(s, word):
        s += word + rl.gen("a", max_tokens=2)
        s += rl.gen("b", max_tokens=3)

    states = prog.run_batch([{"word": "ok"}, {"word": "BAD"}, {"word": "fine"}], backend=fake)
    assert states[0]["b"] == "<3>" and states[2]["b"] == "<3>"
    bad = states[1]
    assert isinstance(bad.error(), InvalidRequestError)
    for read in (lambda: bad["a"], lambda: bad["b"], bad.text):
        with pytest.raises(InvalidRequestError, match="BAD"):
            read()
    # The failed program's later gen was skipped.
    assert sum("BAD" in p for p in fake.prompts_of()) == 1


def test_program_exceptions_kept_in_batch_and_raised_by_run(fake):
    @rl.function
    def prog(s, fail):
        s += "x"
        if fail:
            raise RuntimeError("boom")
        s += rl.gen("a", max_tokens=1)

    ok, failed = prog.run_batch([{"fail": False}, {"fail": True}], backend=fake)
    assert ok["a"] == "<1>"
    assert isinstance(failed.error(), RuntimeError)
    with pytest.raises(RuntimeError, match="boom"):
        prog.run(fail=True, backend=fake)


def test_unknown_variable_is_a_key_error(fake):
    @rl.function
    def prog(s):
        s += "x"

    with pytest.raises(KeyError, match="nope"):
        prog.run(backend=fake)["nope"]


def test_fork_commits_prefix_then_branches(fake):
    @rl.function
    def prog(s):
        s += "Shared prefix. "
        forks = s.fork(3)
        forks += lambda i: f"Branch {i}: " + rl.gen("idea", max_tokens=i + 1)
        s += "Best: " + forks[2]["idea"]
        s["ideas"] = [f["idea"] for f in forks]

    state = prog.run(backend=fake)
    kinds = [(c["prompts"], c["sampling_params"]["max_new_tokens"]) for _, c in fake.calls]
    assert kinds[0] == (["Shared prefix. "], 0)  # the commit comes first
    assert sorted(p for p, _ in kinds[1:]) == [[f"Shared prefix. Branch {i}: "] for i in range(3)]
    assert state["ideas"] == ["<1>", "<2>", "<3>"]
    assert state.text() == "Shared prefix. Best: <3>"


def test_fork_group_iadd_forms_and_join_modes(fake):
    @rl.function
    def prog(s):
        s += "P"
        forks = s.fork(2)
        forks += "-"
        forks += ["a", "b"]
        for i in range(len(forks)):
            forks[i] += rl.gen("g", max_tokens=i + 1)
        forks.join()
        more = s.fork(2)
        for f in more:
            f += "|" + rl.gen("h", max_tokens=9)
        more.join("concate_and_append")
        s += "!"

    state = prog.run(backend=fake)
    assert state["g"] == ["<1>", "<2>"]
    assert state.text() == "P|<9>|<9>!"
    with pytest.raises(ValueError, match="join mode"):
        state.fork(1).join("bad")


def test_copy_is_independent(fake):
    @rl.function
    def prog(s):
        s += "base"

    state = prog.run(backend=fake)
    other = state.copy()
    other += " more"
    assert other.text() == "base more" and state.text() == "base"


def test_var_scope(fake):
    @rl.function
    def prog(s):
        s += "{"
        with s.var_scope("obj"):
            s += '"n": ' + rl.gen("n", max_tokens=2) + ", "
            s += '"m": ' + rl.gen("m", max_tokens=3)
        s += "}"

    state = prog.run(backend=fake)
    assert state["obj"] == '"n": <2>, "m": <3>'
    assert state.text() == '{"n": <2>, "m": <3>}'


def test_meta_info_and_ret_value(fake):
    @rl.function
    def prog(s):
        s += "x" + rl.gen("a", max_tokens=2)
        return "done"

    state = prog.run(backend=fake)
    assert state.ret_value == "done"
    assert state.get_meta_info("a")["finish_reason"] == {"type": "length", "length": 2}


def test_streaming_text_iter_and_async(fake):
    fake.gen_text = lambda prompt, params: "abcdefghi"

    @rl.function
    def prog(s):
        s += "Q: "
        s += rl.gen("a", max_tokens=9)
        s += " end"

    state = prog.run(backend=fake, stream=True)
    pieces = list(state.text_iter())
    assert pieces == ["Q: ", "abc", "def", "ghi", " end"]
    assert list(state.text_iter("a")) == ["abc", "def", "ghi"]

    async def collect():
        return [p async for p in state.text_async_iter(var_name="a")]

    assert asyncio.run(collect()) == ["abc", "def", "ghi"]
    assert [k for k, _ in fake.calls] == ["stream"]
    # Without stream=True, text_iter yields the finished text once.
    assert list(prog.run(backend=fake).text_iter()) == ["Q: abcdefghi end"]


def test_streaming_error_ends_iteration(fake):
    @rl.function
    def prog(s):
        s += "BAD " + rl.gen("a", max_tokens=2)

    state = prog.run(backend=fake, stream=True)
    with pytest.raises(InvalidRequestError):
        list(state.text_iter())


def test_bind_positional_and_call(fake):
    @rl.function
    def prog(s, a, b):
        s += f"{a}+{b}"

    assert prog.bind(b=2).run(1, backend=fake).text() == "1+2"
    assert prog("x", "y", backend=fake).text() == "x+y"
    with pytest.raises(TypeError):
        prog.run(1, 2, 3, backend=fake)


def test_run_batch_caches_traced_prefix_once(fake):
    @rl.function
    def few_shot(s, question):
        s += rl.system("Answer briefly.")
        s += "Q: 1+1?\nA: 2\n"
        s += "Q: " + question + "\nA:" + rl.gen("answer", max_tokens=2)

    prefix = "<|im_start|>system\nAnswer briefly.<|im_end|>\nQ: 1+1?\nA: 2\n"
    assert few_shot.trace_prefix(backend=fake) == prefix
    states = few_shot.run_batch([{"question": f"{i}+{i}?"} for i in range(4)], backend=fake)
    assert [s["answer"] for s in states] == ["<2>"] * 4
    first = fake.calls[0][1]
    assert first["prompts"] == [prefix] and first["sampling_params"]["max_new_tokens"] == 0
    assert sum(c["sampling_params"]["max_new_tokens"] == 0 for _, c in fake.calls) == 1


@pytest.mark.parametrize(
    "body",
    [
        lambda s, q: s.__iadd__(f"Q{q}"),
        lambda s, q: s.__iadd__("x" if q else "y"),
        lambda s, q: s.__iadd__(rl.gen("a") + q),
        lambda s, q: s.fork(2),
        lambda s, q: s["a"],
    ],
)
def test_trace_stops_at_first_dynamic_use(fake, body):
    @rl.function
    def prog(s, q):
        s += "const "
        body(s, q)
        s += "never"

    assert prog.trace_prefix(backend=fake) == "const "


def test_no_backend_and_bad_backend_errors():
    @rl.function
    def prog(s):
        s += "x"

    previous = rl.lang.get_default_backend()
    rl.lang.program._default_backend = None
    try:
        with pytest.raises(ValueError, match="set_default_backend"):
            prog.run()
    finally:
        rl.lang.program._default_backend = previous
    with pytest.raises(TypeError, match="not a backend"):
        prog.run(backend=object())
    with pytest.raises(TypeError, match="list of dicts"):
        prog.run_batch(["x"], backend=FakeBackend())
