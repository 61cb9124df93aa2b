"""/generate with SGLang's sampling parameters, lora_path and max_new_tokens 0; and stop
handling consistent everywhere: when a stop string ends the text, completion_tokens, the
output logprob entries and output_ids count the same tokens, streamed or not, with and
without n-gram speculation."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import running_server, sse_payloads

PROMPT = "Once upon a time"
STOPS = [".", "skyscrapers and", " the"]  # one token, several tokens, a word


def test_sglang_sampling_params_are_taken(http):
    params = {
        "max_new_tokens": 4,
        "temperature": 0,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": False,
        "no_stop_trim": False,
        "stream_interval": 2,
        "custom_params": None,
        "top_k": None,
        "n": 2,
    }
    r = http.post("/generate", json={"text": PROMPT, "sampling_params": params})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == 2 and out[0]["text"] == out[1]["text"]
    seeded = {"max_new_tokens": 4, "temperature": 1.0}
    a = http.post(
        "/generate", json={"text": PROMPT, "sampling_params": {**seeded, "sampling_seed": 7}}
    )
    b = http.post("/generate", json={"text": PROMPT, "sampling_params": {**seeded, "seed": 7}})
    assert a.json()["output_ids"] == b.json()["output_ids"]


@pytest.mark.parametrize(
    "body,param,words",
    [
        ({"lora_path": "adapters/x"}, "lora_path", "LoRA adapters are not supported"),
        ({"sampling_params": {"stop_regex": "a+"}}, "sampling_params", "stop_regex"),
        ({"sampling_params": {"n": 0}}, "sampling_params", "n must be"),
    ],
)
def test_generate_refusals(http, body, param, words):
    r = http.post("/generate", json={"text": PROMPT, **body})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


def test_max_new_tokens_zero_returns_the_next_position_top_logprobs(http):
    body = {"text": "The capital of France is", "return_logprob": True, "top_logprobs_num": 3}
    zero = http.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 0}}).json()
    one = http.post(
        "/generate", json={**body, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    ).json()
    meta = zero["meta_info"]
    assert zero["output_ids"] == [] and meta["completion_tokens"] == 0
    assert meta["output_token_logprobs"] == []
    tops = meta["output_top_logprobs"]
    assert len(tops) == 1 and len(tops[0]) == 3
    assert [t[1] for t in tops[0]] == [t[1] for t in one["meta_info"]["output_top_logprobs"][0]]
    assert tops[0][0][1] == one["output_ids"][0]  # greedy takes the top alternative


def test_token_ids_logprob_scores_the_asked_ids(http):
    """token_ids_logprob on /generate: with max_new_tokens 0 the next position's logprobs
    of the asked ids, equal to scoring each id as the prompt's continuation."""
    prompt = http.post("/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    asked = [12095, 260, 1345]
    body = {"input_ids": prompt, "return_logprob": True, "token_ids_logprob": asked,
            "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 0}}  # fmt: skip
    meta = http.post("/generate", json=body).json()["meta_info"]
    (entries,) = meta["output_token_ids_logprobs"]
    assert [e[1] for e in entries] == asked and all(isinstance(e[2], str) for e in entries)
    scored = http.post(
        "/generate",
        json={"input_ids": [prompt + [t] for t in asked], "return_logprob": True,
              "logprob_start_len": len(prompt), "sampling_params": {"max_new_tokens": 0}},
    ).json()  # fmt: skip
    want = [r["meta_info"]["input_token_logprobs"][0][0] for r in scored]
    assert [e[0] for e in entries] == pytest.approx(want, abs=1e-4)
    for bad in ([10**9], ["x"], [1.5], 3):
        r = http.post("/generate", json={**body, "token_ids_logprob": bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"].startswith("token_ids_logprob")


def _events(client: httpx.Client, route: str, body: dict) -> list[dict]:
    with client.stream("POST", route, json={**body, "stream": True}) as r:
        return [json.loads(p) for p in sse_payloads(r.iter_lines()) if p != "[DONE]"]


def _check_consistent(client: httpx.Client, stop: str, logprobs: bool) -> str:
    """Assert the three counts agree on every route and mode; return the text."""
    lp_cmpl = {"logprobs": 1} if logprobs else {}
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": stop, **lp_cmpl}
    full = client.post("/v1/completions", json=body).json()
    choice, usage = full["choices"][0], full["usage"]
    assert choice["finish_reason"] == "stop" and stop not in choice["text"]
    if logprobs:
        assert len(choice["logprobs"]["tokens"]) == usage["completion_tokens"]
    events = _events(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == choice["text"]
    assert events[-1]["usage"]["completion_tokens"] == usage["completion_tokens"]
    if logprobs:
        n = sum(len(c["logprobs"]["tokens"]) for e in events for c in e["choices"])
        assert n == usage["completion_tokens"]
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
            "temperature": 0, "stop": stop, "logprobs": logprobs}  # fmt: skip
    cfull = client.post("/v1/chat/completions", json=chat).json()
    if logprobs:
        entries = cfull["choices"][0]["logprobs"]["content"]
        assert len(entries) == cfull["usage"]["completion_tokens"]
    cev = _events(
        client, "/v1/chat/completions", {**chat, "stream_options": {"include_usage": True}}
    )
    if logprobs:
        n = sum(len((c["logprobs"] or {}).get("content") or []) for e in cev for c in e["choices"])
        assert n == cev[-1]["usage"]["completion_tokens"] == cfull["usage"]["completion_tokens"]
    gen = {"text": PROMPT, "return_logprob": logprobs,
           "sampling_params": {"max_new_tokens": 40, "temperature": 0, "stop": stop}}  # fmt: skip
    g = client.post("/generate", json=gen).json()
    assert g["text"] == choice["text"]
    assert len(g["output_ids"]) == g["meta_info"]["completion_tokens"] == usage["completion_tokens"]
    if logprobs:
        assert len(g["meta_info"]["output_token_logprobs"]) == len(g["output_ids"])
    last = _events(client, "/generate", gen)[-1]
    assert last["output_ids"] == g["output_ids"] and last["text"] == g["text"]
    return choice["text"]


@pytest.mark.parametrize("stop", STOPS)
def test_stop_counts_agree(http, stop):
    _check_consistent(http, stop, logprobs=True)


@pytest.fixture(scope="module")
def spec() -> httpx.Client:
    with running_server("--speculative-algorithm", "ngram", "--speculative-topk", "2") as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


@pytest.mark.parametrize("stop", STOPS)
def test_stop_counts_agree_with_speculation(spec, http, stop):
    plain = _check_consistent(http, stop, logprobs=False)
    assert _check_consistent(spec, stop, logprobs=False) == plain
    _check_consistent(spec, stop, logprobs=True)
