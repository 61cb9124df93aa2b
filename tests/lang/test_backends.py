"""Programs on the bundled model through the in-process Engine and a real server
(RuntimeEndpoint): greedy agreement, cache reuse by forks and batches, select against a
transformers reference, constrained and logprob gens, streaming, errors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

import radixlm as rl
from radixlm.errors import InvalidRequestError
from radixlm.lang import choices as ch
from tests.lang.conftest import delta, scheduler_counters

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0}


@pytest.fixture(params=["engine", "endpoint"])
def backend(request):
    return request.getfixturevalue("engine_backend" if request.param == "engine" else "endpoint")


# ---- programs -------------------------------------------------------------------------


@rl.function
def multi_turn(s, questions):
    s += rl.system("You are a helpful assistant. Answer in one short sentence.")
    for i, q in enumerate(questions):
        with s.user():
            s += q
        s += rl.assistant(rl.gen(f"a{i}", max_tokens=12))


FEW_SHOT = (
    "Answer with one word.\n\n"
    "Q: What is the capital of France?\nA: Paris\n\n"
    "Q: What color is snow?\nA: White\n\n"
    "Q: How many wheels does a bicycle have?\nA: Two\n\n"
    "Q: What do cows drink?\nA: Water\n\n"
    "Q: What is the opposite of up?\nA: Down\n\n"
)
QUESTIONS = [
    "What is the capital of Spain?",
    "What color is coal?",
    "What animal barks?",
    "What is two plus two?",
    "What is the largest ocean?",
    "What do bees make?",
    "What season is coldest?",
    "What is the capital of Germany?",
    "What color is the sun?",
    "What gas do we breathe?",
    "What is ice made of?",
    "What planet do we live on?",
    "What is the opposite of day?",
    "How many legs does a cat have?",
    "What fruit is yellow?",
    "What is the capital of Egypt?",
]


@rl.function
def few_shot(s, question):
    s += FEW_SHOT
    s += "Q: " + question + "\nA:" + rl.gen("answer", max_tokens=4, stop="\n")


@rl.function
def branches(s, topic):
    s += rl.system("You are a creative assistant.")
    s += rl.user(f"Give me one idea about {topic}.")
    forks = s.fork(4)
    forks += lambda i: rl.assistant(f"Idea {i + 1}:" + rl.gen("idea", max_tokens=8))
    forks.join()
    s += rl.user("Thanks!")
    s += rl.assistant(rl.gen("thanks", max_tokens=6))
    return forks


@rl.function
def scoped(s):
    s += "Name three colors: "
    with s.var_scope("colors"):
        s += rl.gen("first", max_tokens=3, stop=",") + "," + rl.gen("rest", max_tokens=6)


def run_suite(backend) -> list:
    """Greedy results of every program above (texts and variables)."""
    out = []
    st = multi_turn.run(questions=["What is 2+2?", "And 3+3?"], backend=backend, **GREEDY)
    out.append((st.text(), st["a0"], st["a1"], st.messages()))
    states = few_shot.run_batch([{"question": q} for q in QUESTIONS[:4]], backend=backend, **GREEDY)
    out.append([s["answer"] for s in states])
    st = branches.run(topic="gardens", backend=backend, **GREEDY)
    out.append((st["idea"], st["thanks"], st.text()))
    st = scoped.run(backend=backend, **GREEDY)
    out.append((st["colors"], st["first"], st["rest"]))
    return out


# ---- tests ----------------------------------------------------------------------------


def test_chat_text_tokenizes_like_the_chat_template(engine_backend, tokenizer):
    st = multi_turn.run(questions=["Hi"], backend=engine_backend, max_new_tokens=4, **GREEDY)
    ids = tokenizer.encode(st.text(), add_special_tokens=False)
    expected = tokenizer.apply_chat_template(st.messages(), tokenize=True, return_dict=False)
    assert ids == list(expected)


def test_gen_equals_a_plain_generate(engine_backend):
    st = multi_turn.run(questions=["Name a fruit."], backend=engine_backend, **GREEDY)
    prompt = st.text()[: st.text().rindex(st["a0"] + "<|im_end|>")]
    raw = engine_backend.engine_call(
        lambda e: e.generate(prompt, {"max_new_tokens": 12, "temperature": 0})
    )
    assert st["a0"] == raw["text"] and st["a0"]


def test_greedy_identical_across_backends(engine_backend, endpoint):
    assert run_suite(engine_backend) == run_suite(endpoint)


def test_fork_branches_hit_the_shared_prefix(backend, tokenizer):
    st = branches.run(topic="rivers", backend=backend, **GREEDY)
    forks = st.ret_value
    shared = st.text()[: forks[0].stream_executor.fork_start_text_pos]
    shared_len = len(tokenizer.encode(shared, add_special_tokens=False))
    for f in forks:
        meta = f.get_meta_info("idea")
        assert meta["cached_tokens"] >= shared_len, (meta, shared_len)


def test_run_batch_computes_the_prefix_once(backend, tokenizer):
    prefix_len = len(tokenizer.encode(FEW_SHOT, add_special_tokens=False))
    assert rl.flush_cache(backend)
    before = scheduler_counters(backend)
    states = few_shot.run_batch([{"question": q} for q in QUESTIONS], backend=backend, **GREEDY)
    d = delta(scheduler_counters(backend), before)
    metas = [s.get_meta_info("answer") for s in states]
    assert all(m["cached_tokens"] >= prefix_len - 1 for m in metas), metas
    own = sum(m["prompt_tokens"] - (prefix_len - 1) for m in metas)  # tokens past the prefix
    # The prefix commit plus each program's own tokens: the prefix is computed once.
    assert d["prompt_tokens_total"] == prefix_len + sum(m["prompt_tokens"] for m in metas)
    assert d["prefill_tokens_total"] <= prefix_len + own
    assert d["prefill_tokens_total"] < 2 * prefix_len + own - len(QUESTIONS)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    from radixlm.runtime.executor.model_registry import local_hf_dir

    return AutoModelForCausalLM.from_pretrained(local_hf_dir("smollm2-135m"), dtype=torch.float32)


def reference_scores(model, tokenizer, prompt: str, choices: list[str]) -> list[float]:
    """Mean logprob of each choice's tokens after `prompt`, from one transformers forward."""
    base = tokenizer.encode(prompt, add_special_tokens=False)
    scores = []
    for c in choices:
        ids = tokenizer.encode(prompt + c, add_special_tokens=False)
        keep = next((i for i, (a, b) in enumerate(zip(base, ids)) if a != b), len(base))
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        token_lp = [logprobs[p - 1, ids[p]].item() for p in range(keep, len(ids))]
        scores.append(sum(token_lp) / len(token_lp))
    return scores


SELECT_CASES = [
    ("Is the sky blue? Answer yes or no.", ["Yes", "No", "Maybe not"]),
    ("Which is a fruit?", ["A banana", "A hammer", "A car engine"]),
    ("Pick a number.", ["7", "seventy-seven", "0.5"]),
]


@pytest.mark.parametrize("question,options", SELECT_CASES)
def test_select_matches_transformers(backend, hf_model, tokenizer, question, options):
    @rl.function
    def ask(s):
        s += rl.user(question)
        s += rl.assistant(rl.select("pick", choices=options))

    st = ask.run(backend=backend)
    prompt = st.text()[: st.text().rindex(st["pick"])]
    ref = reference_scores(hf_model, tokenizer, prompt, options)
    meta = st.get_meta_info("pick")
    assert meta["normalized_prompt_logprobs"] == pytest.approx(ref, abs=2e-3)
    assert st["pick"] == options[max(range(len(ref)), key=ref.__getitem__)]


def test_select_with_a_token_merged_across_the_boundary(backend, hf_model, tokenizer):
    """A prompt ending in a space: "Answer: " + "yes" tokenizes as "Answer:" + " yes", so
    the choice's tokens start before the prompt's end; its scores still match."""
    prompt, options = "Is fire hot? Answer: ", ["yes", "no", "not at all"]
    base = tokenizer.encode(prompt)
    assert all(tokenizer.encode(prompt + c)[: len(base)] != base for c in options)

    @rl.function
    def ask(s):
        s += prompt + rl.select("pick", choices=options)

    meta = ask.run(backend=backend).get_meta_info("pick")
    ref = reference_scores(hf_model, tokenizer, prompt, options)
    assert meta["normalized_prompt_logprobs"] == pytest.approx(ref, abs=2e-3)


def test_select_recomputes_one_prompt_position_per_choice(engine_backend, tokenizer):
    """The scoring batch prefills each choice from the position before its first token:
    the prompt once, then len(prompt + choice) - start + 1 tokens per choice."""
    prompt, options = "The capital of France is", [" Paris", " Rome", " a city in Europe"]
    engine_backend.flush_cache()
    before = scheduler_counters(engine_backend)

    @rl.function
    def ask(s):
        s += prompt + rl.select("pick", choices=options)

    assert ask.run(backend=engine_backend)["pick"] in options
    d = delta(scheduler_counters(engine_backend), before)
    base = tokenizer.encode(prompt)
    full = [tokenizer.encode(prompt + c) for c in options]
    start = min(next(i for i, (x, y) in enumerate(zip(ids, base + [-1])) if x != y) for ids in full)
    assert d["prefill_tokens_total"] == len(base) + sum(len(ids) - start + 1 for ids in full)


@pytest.mark.parametrize(
    "prompt,options",
    [("Rate the answer from 1 to 5.\nScore: ", ["1", "2", "3", "4", "5"]),
     ("Is fire hot? Answer: ", ["yes", "no"])],  # " yes", " no": merged with the space
)  # fmt: skip
def test_one_token_choices_scored_from_the_prompt(backend, hf_model, tokenizer, prompt, options):
    """Every choice one token after the same prompt position: one request scores them
    all from that position (token_ids_logprob), and the scores match transformers."""
    base = tokenizer.encode(prompt)
    full = [tokenizer.encode(prompt + c) for c in options]
    k = len(full[0]) - 1
    assert all(len(ids) == k + 1 and ids[:k] == base[:k] for ids in full)
    backend.flush_cache()
    before = scheduler_counters(backend)

    @rl.function
    def ask(s):
        s += prompt + rl.select("pick", choices=options)

    st = ask.run(backend=backend)
    ref = reference_scores(hf_model, tokenizer, prompt, options)
    assert st.get_meta_info("pick")["normalized_prompt_logprobs"] == pytest.approx(ref, abs=2e-3)
    assert st["pick"] == options[max(range(len(ref)), key=ref.__getitem__)]
    assert backend.asks_token_ids
    # one request: the prompt's first k tokens, no choice row
    assert delta(scheduler_counters(backend), before)["prefill_tokens_total"] == k


def test_endpoint_token_ids_after_a_refused_prompt(endpoint, tokenizer):
    """/tokenize refusing a prompt too long gives None (select falls back, and its scoring
    request reports the 400), and the next texts are still tokenized by the server."""
    too_long = "hello " * 20000
    assert endpoint.token_ids(["short", too_long]) is None
    with pytest.raises(InvalidRequestError, match="context length"):
        endpoint.select(too_long, ["a", "b"], 0.0, ch.token_length_normalized)
    with pytest.raises(InvalidRequestError) as e:  # the server's param reaches the client
        endpoint.request(
            input_ids=[[1, 2]],
            sampling_params={"max_new_tokens": 0},
            logprob={"return_logprob": True, "token_ids_logprob": [10**9]},
        )
    assert e.value.param.startswith("token_ids_logprob") and e.value.code == "invalid_value"
    assert endpoint.token_ids(["Answer: ", "Answer: yes"]) == [
        tokenizer.encode("Answer: "),
        tokenizer.encode("Answer: yes"),
    ]


def test_select_first_in_a_program(backend, tokenizer):
    """An empty prompt: one-token choices have no logprob (UNSCORED) and lose to the
    multi-token one, scored on its later tokens."""
    options = ["Hello", "Goodbye", " The"]
    assert [len(tokenizer.encode(c)) for c in options] == [1, 2, 1]

    @rl.function
    def first(s):
        s += rl.select("pick", choices=options)

    st = first.run(backend=backend)
    scores = st.get_meta_info("pick")["normalized_prompt_logprobs"]
    assert st["pick"] == "Goodbye"
    assert scores[0] == scores[2] == ch.UNSCORED and scores[1] < 0


def test_select_methods_and_control_flow(backend):
    @rl.function
    def agent(s):
        s += rl.user("Should I bring an umbrella when it rains? Answer yes or no.")
        s += rl.assistant_begin()
        s += rl.select("first", choices=["yes", "no"], choices_method=ch.greedy_token_selection)
        s += rl.assistant_end()
        s += rl.user("Say it again.")
        s += rl.assistant(
            rl.gen(
                "again",
                choices=["yes", "no"],
                choices_method=ch.unconditional_likelihood_normalized,
            )
        )
        if s["again"] == "yes":
            s += "!"
        return s["first"]

    st = agent.run(backend=backend)
    assert st.ret_value in ("yes", "no") and st["again"] in ("yes", "no")
    assert "unconditional_token_logprobs" in st.get_meta_info("again")


def test_constrained_gens(backend):
    schema = {
        "type": "object",
        "properties": {
            "name": {"enum": ["Alice", "Bob", "Carol"]},
            "adult": {"type": "boolean"},
        },
        "required": ["name", "adult"],
        "additionalProperties": False,
    }

    @rl.function
    def constrained(s):
        s += rl.user("Give a person's age.")
        s += rl.assistant_begin()
        s += "Age: " + rl.gen_int("age", max_tokens=4) + "\n"
        s += "Color: " + rl.gen("color", regex=r"(red|green|blue)", max_tokens=4) + "\n"
        s += "Word: " + rl.gen_string("word", max_tokens=8) + "\n"
        s += "JSON: " + rl.gen("person", json_schema=json.dumps(schema), max_tokens=40)

    st = constrained.run(backend=backend, **GREEDY)
    assert re.fullmatch(r"[-+]?[0-9]+[ \n]*", st["age"]), st["age"]
    assert st["color"] in ("red", "green", "blue")
    assert re.fullmatch(r"\"[\w\d\s]*\"", st["word"]), st["word"]
    jsonschema.validate(json.loads(st["person"]), schema)


def test_gen_logprobs_in_meta_info(backend):
    @rl.function
    def prog(s):
        s += "The capital of France is"
        s += rl.gen("x", max_tokens=5, return_logprob=True, top_logprobs_num=3)

    st = prog.run(backend=backend, **GREEDY)
    meta = st.get_meta_info("x")
    out = meta["output_token_logprobs"]
    assert len(out) == meta["completion_tokens"]
    for (lp, tok, _), top in zip(out, meta["output_top_logprobs"]):
        assert len(top) == 3 and top[0][1] == tok and top[0][0] == pytest.approx(lp)


def test_streaming_equals_non_streaming(backend):
    @rl.function
    def story(s):
        s += rl.user("Tell me a short story about a fox.")
        s += rl.assistant(rl.gen("story", max_tokens=16))

    whole = story.run(backend=backend, **GREEDY)
    streamed = story.run(backend=backend, stream=True, **GREEDY)
    pieces = list(streamed.text_iter("story"))
    assert len(pieces) > 1 and "".join(pieces) == whole["story"] == streamed["story"]
    assert "".join(streamed.text_iter()) == whole.text()


def test_errors_surface_without_stopping_other_programs(backend):
    @rl.function
    def prog(s, t):
        s += "Count: " + rl.gen("x", max_tokens=3, temperature=t)
        s += rl.gen("y", max_tokens=2)

    states = prog.run_batch(  # temperature -1 is refused by the server
        [{"t": 0.0}, {"t": -1.0}, {"t": 0.5}], backend=backend, num_threads=3
    )
    assert states[0].error() is None and states[2].error() is None
    assert isinstance(states[1].error(), InvalidRequestError)
    with pytest.raises(InvalidRequestError):
        states[1]["x"]
    assert states[0]["y"] is not None and states[2]["y"] is not None
    # The backend keeps serving.
    assert prog.run(t=0.0, backend=backend).error() is None


def test_server_info_and_flush(backend):
    info = rl.get_server_info(backend)
    assert info["scheduler"]["prompt_tokens_total"] > 0
    assert rl.flush_cache(backend) is True


def test_engine_as_default_backend(engine_backend):
    previous = rl.lang.get_default_backend()
    try:
        rl.set_default_backend(engine_backend.engine)  # an Engine is wrapped once
        assert rl.lang.get_default_backend() is engine_backend
        st = multi_turn.run(questions=["Hi"], max_new_tokens=3, temperature=0)
        assert st.error() is None and st["a0"]
    finally:
        rl.lang.program._default_backend = previous
