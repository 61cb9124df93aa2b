"""select's request plan and the choice methods, on the model-free backend (char tokens)."""

from __future__ import annotations

import random

import pytest

import radixlm as rl
from radixlm.lang import choices as ch
from tests.lang.fake_backend import FakeBackend, char_logprob

CHOICES = ["yes", "no", "maybe"]


def mean_logprob(text: str) -> float:
    return sum(char_logprob(c) for c in text) / len(text)


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


def run_select(fake, **kw):
    @rl.function
    def prog(s):
        s += "Answer: "
        s += rl.select("pick", choices=CHOICES, **kw)

    return prog.run(backend=fake)


def test_token_length_normalized_picks_best_mean_in_one_batch(fake):
    state = run_select(fake)
    best = max(CHOICES, key=mean_logprob)
    assert state["pick"] == best
    assert state.text() == "Answer: " + best
    meta = state.get_meta_info("pick")
    assert meta["normalized_prompt_logprobs"] == pytest.approx([mean_logprob(c) for c in CHOICES])
    assert [[e[2] for e in entries] for entries in meta["input_token_logprobs"]] == [
        list(c) for c in CHOICES
    ]
    # 1) cache the prompt, 2) one batch: the prompt and prompt + each choice.
    (k1, commit), (k2, batch) = fake.calls
    assert commit["prompts"] == ["Answer: "] and commit["sampling_params"]["max_new_tokens"] == 0
    assert batch["prompts"] == ["Answer: "] + ["Answer: " + c for c in CHOICES]
    assert batch["sampling_params"] == {"max_new_tokens": 0, "temperature": 0}
    assert batch["logprob"]["logprob_start_len"] == len("Answer: ") - 2


class TokenizingFake(FakeBackend):
    """The fake with local ids (one token per character, as its server tokenizes)."""

    def token_ids(self, texts):
        return [[ord(c) for c in t] for t in texts]


@pytest.mark.parametrize(
    "method",
    [ch.token_length_normalized, ch.greedy_token_selection, ch.unconditional_likelihood_normalized],
)
def test_local_ids_score_each_choice_from_where_it_leaves_the_prompt(method):
    """With local ids the batch holds only prompt + choice, its logprobs start at the
    choices' first token, and every method decides and reports as without them."""
    plain, local = FakeBackend(), TokenizingFake()
    a, b = (run_select(f, choices_method=method) for f in (plain, local))
    assert b["pick"] == a["pick"]
    assert b.get_meta_info("pick") == a.get_meta_info("pick")
    (_, commit), (_, batch) = local.calls[:2]
    prompt = [ord(c) for c in "Answer: "]
    assert commit["prompts"] == [prompt] and commit["logprob"] is None
    assert batch["prompts"] == [prompt + [ord(x) for x in c] for c in CHOICES]
    assert batch["logprob"]["logprob_start_len"] == len(prompt)


@pytest.mark.parametrize(
    "method",
    [ch.token_length_normalized, ch.greedy_token_selection, ch.unconditional_likelihood_normalized],
)
@pytest.mark.parametrize("answers", ["yes", "omits", "refuses"])
def test_one_token_choices_score_in_one_request(method, answers):
    """Choices one token each after the prompt: one request (the prompt, with the
    choices' ids in token_ids_logprob) scores them, and every method decides and
    reports as the plain path. A server that leaves the field unanswered or refuses it
    as unknown gets the two-request plan, and is not asked again."""
    options = ["1", "2", "3", "4", "5"]

    @rl.function
    def prog(s):
        s += "Score: " + rl.select("pick", choices=options, choices_method=method)

    plain, local = FakeBackend(), TokenizingFake()
    local.answers_token_ids = answers
    a, b = (prog.run(backend=f) for f in (plain, local))
    assert b["pick"] == a["pick"]
    assert b.get_meta_info("pick") == a.get_meta_info("pick")
    prompt = [ord(c) for c in "Score: "]
    kind, first = local.calls[0]
    assert first["prompts"] == [prompt] and first["sampling_params"]["max_new_tokens"] == 0
    assert first["logprob"]["token_ids_logprob"] == [ord(c) for c in options]
    scoring = [c for k, c in local.calls if c["logprob"] and c["logprob"].get("logprob_start_len")]
    assert local.asks_token_ids is (answers == "yes")
    assert len(scoring) == (0 if answers == "yes" else 1)
    if answers != "yes":
        prog.run(backend=local)
        assert sum("token_ids_logprob" in (c["logprob"] or {}) for _, c in local.calls) == 1


@pytest.mark.parametrize(
    "method",
    [ch.token_length_normalized, ch.greedy_token_selection, ch.unconditional_likelihood_normalized],
)
def test_a_choice_without_a_scored_token_never_wins(fake, method):
    """With an empty prompt a one-token choice has no logprob (nothing precedes it): it
    scores UNSCORED (-inf) and loses to any scored choice, however unlikely."""

    @rl.function
    def prog(s):
        s += rl.select("pick", choices=["a", "zzzz"], choices_method=method)

    state = prog.run(backend=fake)
    assert state["pick"] == "zzzz"
    assert state.get_meta_info("pick")["normalized_prompt_logprobs"] == [
        ch.UNSCORED,
        pytest.approx(mean_logprob("zzz")),
    ]


def test_unscored_choices_alone():
    """No choice scored: the first wins greedily, and sampling is uniform (no NaN)."""
    kw = {
        "choices": ["a", "b"],
        "normalized_prompt_logprobs": [ch.UNSCORED, ch.UNSCORED],
        "input_token_logprobs": [[[None, 1, "a"]], [[None, 2, "b"]]],
        "output_token_logprobs": [[], []],
    }
    assert ch.token_length_normalized(**kw).decision == "a"
    assert ch.greedy_token_selection(**kw).decision == "a"
    assert [ch.softmax_sample([ch.UNSCORED] * 2, 1.0, r) for r in (0.2, 0.7)] == [0, 1]


def test_greedy_token_selection_follows_first_token(fake):
    state = run_select(fake, choices_method=ch.greedy_token_selection)
    rows = {c: [char_logprob(x) for x in c] for c in CHOICES}
    assert state["pick"] == max(CHOICES, key=lambda c: rows[c][0])


def test_unconditional_likelihood_normalized(fake):
    state = run_select(fake, choices_method=ch.unconditional_likelihood_normalized)

    def score(c):
        uncond = [char_logprob(x) for x in c[1:]]
        return mean_logprob(c) - (sum(uncond) / len(uncond) if uncond else 0.0)

    assert state["pick"] == max(CHOICES, key=score)
    assert fake.calls[-1][1]["prompts"] == [[ord(x) for x in c] for c in CHOICES]


def test_gen_with_choices_is_select(fake):
    @rl.function
    def prog(s):
        s += "Answer: " + rl.gen("pick", choices=CHOICES)

    assert prog.run(backend=fake)["pick"] == max(CHOICES, key=mean_logprob)


def test_temperature_samples_all_choices():
    entries = [[[-1.0, 1, "a"]], [[-1.2, 2, "b"]]]
    kw = {
        "choices": ["a", "b"],
        "normalized_prompt_logprobs": [-1.0, -1.2],
        "input_token_logprobs": entries,
        "output_token_logprobs": [[], []],
    }
    assert ch.token_length_normalized(**kw).decision == "a"
    rng = random.Random(0)
    picks = {ch.softmax_sample([-1.0, -1.2], 1.0, rng.random()) for _ in range(200)}
    assert picks == {0, 1}
    assert ch.softmax_sample([0.0, -50.0], 0.01, 0.999) == 0


def test_greedy_ties_and_exhausted_choices():
    m = ch.greedy_token_selection
    rows = [[[-0.5, 1, "a"]], [[-0.5, 1, "a"], [-0.1, 2, "b"]], [[-0.9, 3, "c"]]]
    kw = {
        "choices": ["a", "ab", "c"],
        "normalized_prompt_logprobs": [-0.5, -0.3, -0.9],
        "input_token_logprobs": rows,
        "output_token_logprobs": [[], [], []],
    }
    # "a" and "ab" tie on the first token; "a" then competes with its mean (-0.5) < -0.1.
    assert m(**kw).decision == "ab"
