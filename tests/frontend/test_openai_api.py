"""The OpenAI API features of issue 5 through the real `openai` client on a real server:
penalties, logit_bias, min_tokens, seeds, stop strings, logprobs (vs transformers),
echo scoring, n / best_of, stream_options, ignored fields, and the native logprob
contract of /generate."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from .conftest import MODEL, running_server

PROMPT = "Once upon a time"
TOL = 1e-4
# Longer than the in-batch prefix guard's 32-token threshold, so n copies share it.
LONG_PROMPT = (
    "The following is a list of facts about the solar system. The Sun is a star. "
    "Mercury is the closest planet to the Sun. Venus is the hottest planet. Earth is"
)


@pytest.fixture(scope="module")
def server():
    with running_server() as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def hf_logprobs():
    """log_softmax of a transformers fp32 forward over token ids: [len, vocab]."""
    from transformers import AutoModelForCausalLM

    from radixlm.runtime.executor.model_registry import local_hf_dir

    model = AutoModelForCausalLM.from_pretrained(local_hf_dir(MODEL), dtype=torch.float32)
    model.eval()

    def run(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)

    return run


def _complete(client, **kw):
    return client.completions.create(model=MODEL, prompt=PROMPT, **kw)


# ---- 1. sampling ----------------------------------------------------------------------


def test_logit_bias_min_tokens_and_penalties(client, tokenizer):
    base = _complete(client, max_tokens=8, temperature=0)
    first = tokenizer.encode(base.choices[0].text, add_special_tokens=False)[0]
    banned = _complete(client, max_tokens=8, temperature=0, logit_bias={str(first): -100})
    assert not banned.choices[0].text.startswith(tokenizer.decode([first]))
    eos = _complete(client, max_tokens=8, temperature=0, logit_bias={"2": 100})
    assert eos.choices[0].finish_reason == "stop" and eos.usage.completion_tokens == 1
    held = _complete(
        client, max_tokens=8, temperature=0, logit_bias={"2": 100}, extra_body={"min_tokens": 3}
    )
    assert held.choices[0].finish_reason == "stop" and held.usage.completion_tokens == 4
    pen = _complete(client, max_tokens=24, temperature=0, frequency_penalty=2.0)
    neg = _complete(client, max_tokens=24, temperature=0, presence_penalty=-2.0)
    rep = _complete(client, max_tokens=24, temperature=0, extra_body={"repetition_penalty": 1.5})
    plain = _complete(client, max_tokens=24, temperature=0)
    assert plain.choices[0].text != pen.choices[0].text
    assert len({pen.choices[0].text, neg.choices[0].text, rep.choices[0].text}) == 3


def test_seed_reproducible_alone_and_batched(client):
    kw = dict(max_tokens=16, temperature=1.0, seed=1234)
    a = _complete(client, **kw).choices[0].text
    b = _complete(client, **kw).choices[0].text
    batched = client.completions.create(
        model=MODEL, prompt=["Hello there", PROMPT, "def f(x):"], **kw
    )
    assert a == b == batched.choices[1].text
    n3 = _complete(client, n=3, **kw)
    assert n3.choices[0].text == a  # copy 0 keeps the seed
    assert len({c.text for c in n3.choices}) == 3  # copies 1, 2 use derived seeds


# ---- 2. stop conditions ----------------------------------------------------------------


def test_stop_string_across_two_tokens(client, tokenizer):
    base = _complete(client, max_tokens=16, temperature=0)
    ids = tokenizer.encode(base.choices[0].text, add_special_tokens=False)
    head = tokenizer.decode(ids[:3])
    t3, t4 = tokenizer.decode(ids[3:4]), tokenizer.decode(ids[4:5])
    stop = t3[-2:] + t4[:2]  # straddles the boundary between tokens 3 and 4
    assert stop not in tokenizer.decode(ids[3:4]) and stop not in tokenizer.decode(ids[4:5])
    expected = (head + t3)[: len(head + t3) - 2]
    out = _complete(client, max_tokens=16, temperature=0, stop=[stop])
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == 5  # the tokens up to the one completing the stop
    stream = _complete(client, max_tokens=16, temperature=0, stop=[stop], stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_no_stop_trim_native(http, tokenizer):
    base = http.post("/generate", json={"text": PROMPT, "sampling_params": _greedy(16)}).json()
    stop = base["text"][5:9]
    body = {"text": PROMPT, "sampling_params": {**_greedy(16), "stop": stop, "no_stop_trim": True}}
    kept = http.post("/generate", json=body).json()
    assert kept["text"] == base["text"][:9]
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


@pytest.mark.parametrize(
    "prompt,expected",
    [
        ("Chinese: 你好世界. 中国. 北京. 上海. 你好", "中国"),
        ("😀 😃 😄 😁 😆 😅 😂 🤣 😊 😇 🙂 🙃 😉 😌 😍", "👩"),
    ],
)
def test_emoji_and_cjk_stream_intact(client, tokenizer, prompt, expected):
    kw = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    full = client.completions.create(**kw)
    text = full.choices[0].text
    assert expected in text and "\ufffd" not in text
    chunks = list(client.completions.create(stream=True, **kw))
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


# ---- 3. logprobs ------------------------------------------------------------------------


def test_completion_logprobs_match_transformers(client, tokenizer, hf_logprobs):
    out = _complete(client, max_tokens=6, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    ref = hf_logprobs(prompt_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    # First output token: its logprob under the prompt's last position.
    first = tokenizer.encode(lp.tokens[0], add_special_tokens=False)
    assert abs(lp.token_logprobs[0] - float(ref[-1, first[0]])) < TOL
    assert len(lp.top_logprobs[0]) == 3 and lp.tokens[0] in lp.top_logprobs[0]


def test_echo_scores_prompt_with_max_tokens_zero(client, tokenizer, hf_logprobs):
    text = "The capital of France is Paris."
    ids = tokenizer.encode(text, add_special_tokens=False)
    out = client.completions.create(
        model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    c = out.choices[0]
    assert c.text == text and out.usage.completion_tokens == 0
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert c.logprobs.tokens == [tokenizer.decode([t]) for t in ids]
    ref = hf_logprobs(ids)
    for k in range(1, len(ids)):
        assert abs(c.logprobs.token_logprobs[k] - float(ref[k - 1, ids[k]])) < TOL
    assert c.logprobs.text_offset[0] == 0 and c.logprobs.text_offset[-1] == len(text) - len(
        c.logprobs.tokens[-1]
    )
    # The same prompt again (now cached): identical scores.
    again = client.completions.create(
        model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    assert again.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        c.logprobs.token_logprobs[1:], abs=TOL
    )


def test_echo_with_generation_and_stream(client):
    full = _complete(client, max_tokens=4, temperature=0, echo=True, logprobs=0)
    c = full.choices[0]
    assert c.text.startswith(PROMPT) and len(c.logprobs.tokens) == 4 + 4  # prompt + output
    chunks = list(_complete(client, max_tokens=4, temperature=0, echo=True, stream=True))
    assert "".join(x.choices[0].text for x in chunks) == c.text


def test_chat_logprobs(client, tokenizer):
    msgs = [{"role": "user", "content": "Say hello."}]
    out = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    text = out.choices[0].message.content
    if out.choices[0].finish_reason == "length":
        assert b"".join(bytes(e.bytes) for e in content).decode() == text
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=TOL)  # greedy
    stream = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    streamed = [
        e
        for ch in stream
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=TOL)


def test_native_logprob_contract(http, tokenizer):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    body = {
        "input_ids": ids,
        "sampling_params": _greedy(3),
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    meta = http.post("/generate", json=body).json()["meta_info"]
    assert [e[1] for e in meta["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0][0] is None and meta["input_top_logprobs"][0] is None
    assert len(meta["output_token_logprobs"]) == 3 and len(meta["output_top_logprobs"]) == 3
    value, tok, text = meta["output_token_logprobs"][0]
    assert text == tokenizer.decode([tok]) and value < 0
    assert [len(t) for t in meta["output_top_logprobs"]] == [2, 2, 2]
    plain = http.post("/generate", json={"text": PROMPT, "sampling_params": _greedy(2)}).json()
    assert "output_token_logprobs" not in plain["meta_info"]


# ---- 4. n and best_of --------------------------------------------------------------------


def test_n_shares_the_prompt_through_the_cache(client, http, tokenizer):
    prompt_len = len(tokenizer.encode(LONG_PROMPT, add_special_tokens=False))
    before = http.get("/get_server_info").json()["scheduler"]
    out = client.completions.create(
        model=MODEL, prompt=LONG_PROMPT, n=3, max_tokens=4, temperature=0.8, seed=5
    )
    after = http.get("/get_server_info").json()["scheduler"]
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.prompt_tokens == prompt_len  # counted once
    assert out.usage.completion_tokens == 12
    admitted = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    cached = after["cached_tokens_total"] - before["cached_tokens_total"]
    assert admitted == 3 * prompt_len
    assert cached >= 2 * (prompt_len - 1)  # copies 1 and 2 hit the prefix copy 0 computed


def test_n3_chat_stream_indices_and_include_usage(client):
    # Greedy copies: the streamed and the plain request run in different batch shapes,
    # and on CPU a seeded draw at temperature 1 can flip on last-bit logit differences.
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a color."}],
        n=3,
        max_tokens=6,
        temperature=0.0,
    )
    full = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    texts, roles, finishes = ["", "", ""], [None] * 3, [None] * 3
    for ch in chunks[:-1]:
        assert ch.usage is None and len(ch.choices) == 1
        c = ch.choices[0]
        if c.delta.role and roles[c.index] is None:
            assert texts[c.index] == ""  # the role comes first
            roles[c.index] = c.delta.role
        texts[c.index] += c.delta.content or ""
        if c.finish_reason:
            finishes[c.index] = c.finish_reason
    assert roles == ["assistant"] * 3 and all(finishes)
    assert texts == [c.message.content for c in full.choices]
    last = chunks[-1]
    assert last.choices == [] and last.usage.total_tokens == full.usage.total_tokens
    assert last.usage.prompt_tokens == full.usage.prompt_tokens


def test_completion_stream_n_echo_logprobs(client):
    kw = dict(n=2, max_tokens=4, temperature=1.0, seed=21, echo=True, logprobs=1)
    full = _complete(client, **kw)
    texts, tokens, offsets = ["", ""], [[], []], [[], []]
    for ch in _complete(client, stream=True, **kw):
        c = ch.choices[0]
        if not texts[c.index]:
            assert c.text.startswith(PROMPT)  # the echo opens each choice
        texts[c.index] += c.text
        if c.logprobs is not None:
            tokens[c.index] += c.logprobs.tokens
            offsets[c.index] += c.logprobs.text_offset
    for i, choice in enumerate(full.choices):
        assert texts[i] == choice.text
        assert tokens[i] == choice.logprobs.tokens
        assert offsets[i] == choice.logprobs.text_offset
    assert full.usage.prompt_tokens == len(full.choices[0].logprobs.tokens) - 4


def test_best_of_returns_the_most_likely(client):
    kw = dict(max_tokens=5, temperature=1.0, seed=3)
    best = _complete(client, n=1, extra_body={"best_of": 3}, logprobs=0, **kw)
    three = _complete(client, n=3, logprobs=0, **kw)
    sums = [sum(c.logprobs.token_logprobs) for c in three.choices]
    assert best.choices[0].text == three.choices[sums.index(max(sums))].text
    assert best.usage.completion_tokens == three.usage.completion_tokens


# ---- 5, 8. streaming usage, validation, ignored fields -----------------------------------


def test_completion_include_usage(client):
    chunks = list(
        _complete(
            client, max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_ignored_fields_are_accepted(client, http):
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        user="u1",
        store=False,
        metadata={"k": "v"},
        service_tier="auto",
        parallel_tool_calls=True,
        extra_body={"reasoning_effort": "low", "web_search_options": {}},
    )
    assert out.usage.completion_tokens == 2
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "suffix": "!"})
    assert r.status_code == 200, r.text


BAD = [
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": -3}, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": "up"}}, None),
    ("/v1/completions", {"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 3, "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "x", "best_of": 2, "stream": True}, "best_of"),
    ("/v1/completions", {"prompt": "x", "n": 100, "max_tokens": 1000}, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "echo": "yes"}, "echo"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        "top_logprobs",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "logprobs": 1},
        "logprobs",
    ),
    (
        "/generate",
        {"text": "x", "return_logprob": True, "top_logprobs_num": -1},
        "top_logprobs_num",
    ),
    (
        "/generate",
        {"text": "x", "return_logprob": True, "logprob_start_len": -2},
        "logprob_start_len",
    ),
    ("/generate", {"text": "x", "sampling_params": {"min_new_tokens": -1}}, "sampling_params"),
]


@pytest.mark.parametrize("route,body,param", BAD, ids=[json.dumps(b)[:50] for _, b, _ in BAD])
def test_bad_values_are_400(http, route, body, param):
    r = http.post(route, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param


def _greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0}
