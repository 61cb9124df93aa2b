"""Native routes: /generate (SGLang shapes), /get_server_info, /get_model_info, /health."""

from __future__ import annotations

import json
import os

from radixlm import omp_policy

from .conftest import COMPLETION_MAX, COMPLETION_PROMPT, MODEL, sse_payloads

GREEDY = {"max_new_tokens": COMPLETION_MAX, "temperature": 0}


def test_generate_text_equals_engine(http, engine_ref):
    ref = engine_ref["completion"]
    out = http.post("/generate", json={"text": COMPLETION_PROMPT, "sampling_params": GREEDY})
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["text"] == ref["text"]
    assert body["output_ids"] == ref["output_ids"]
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": COMPLETION_MAX}
    assert meta["prompt_tokens"] == ref["usage"]["prompt_tokens"]
    assert meta["completion_tokens"] == COMPLETION_MAX
    assert meta["cached_tokens"] >= 0 and meta["id"]


def test_generate_input_ids_batch_and_rid(http, engine_ref, tokenizer):
    ids = tokenizer.encode(COMPLETION_PROMPT, add_special_tokens=False)
    out = http.post(
        "/generate",
        json={"input_ids": [ids, ids], "sampling_params": GREEDY, "rid": ["a-1", "a-2"]},
    ).json()
    assert [o["meta_info"]["id"] for o in out] == ["a-1", "a-2"]
    assert [o["text"] for o in out] == [engine_ref["completion"]["text"]] * 2


def test_generate_stop_reports_match(http, engine_ref):
    full = engine_ref["completion"]["text"]
    stop = full.split()[3]
    params = {**GREEDY, "stop": stop}  # a single string, as SGLang accepts
    meta = http.post("/generate", json={"text": COMPLETION_PROMPT, "sampling_params": params})
    info = meta.json()
    assert info["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert info["text"] == full[: full.index(stop)]


def test_generate_stream_is_cumulative(http, engine_ref):
    body = {"text": COMPLETION_PROMPT, "sampling_params": GREEDY, "stream": True}
    with http.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        payloads = sse_payloads(r.iter_lines())
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == engine_ref["completion"]["text"]
    assert chunks[-1]["output_ids"] == engine_ref["completion"]["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_server_and_model_info(http):
    info = http.get("/get_server_info").json()
    mem = info["memory"]
    assert mem["free"] + mem["evictable"] + mem["protected"] + mem["held"] == mem["total"]
    assert info["max_total_tokens"] == 20000 and info["context_length"] == 8192
    assert info["args"]["api_key"] == "<redacted>"
    # The scheduler process (spawned with this environment) waits at OpenMP barriers by
    # the policy these variables give: radixlm's short spin unless the user chose.
    policy = info["resolved"]["omp_wait_policy"]
    assert policy.startswith(omp_policy.policy_kind(os.environ)), policy
    model = http.get("/get_model_info").json()
    assert model["served_model_name"] == MODEL and model["is_generation"] is True
    assert http.get("/health").status_code == 200


def test_generate_batch_stream_has_indexes(http):
    body = {"text": ["Red,", "One,"], "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    batch = http.post("/generate", json=body).json()
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        chunks = [json.loads(p) for p in sse_payloads(r.iter_lines())[:-1]]
    last = {c["index"]: c for c in chunks}
    assert sorted(last) == [0, 1]
    assert [last[i]["text"] for i in (0, 1)] == [b["text"] for b in batch]


def test_generate_rid_must_be_distinct(http):
    body = {"text": ["a", "b"], "rid": ["same", "same"]}
    resp = http.post("/generate", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "rid"
