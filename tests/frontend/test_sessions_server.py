"""Sessions and Responses pins on a real server with a small KV pool (1024 tokens): a
session turn is served from its pinned prefix after other traffic has cycled the pool,
equals the same request sent without a session, and close / bad ids behave; a stored
response's prefix stays hot for its previous_response_id continuation."""

from __future__ import annotations

import httpx
import pytest

from .conftest import MODEL, running_server, wait_idle

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def http():
    args = ("--max-total-tokens", "1024", "--session-pin-budget", "600")
    with running_server(*args) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


def _ids(seed: int, n: int) -> list[int]:
    return [200 + (seed * 7919 + i * 37) % 40000 for i in range(n)]


def _generate(http, ids, session=None, **params):
    body = {"input_ids": ids, "sampling_params": {**GREEDY, **params}}
    if session is not None:
        body["session_params"] = session
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _traffic(http, n=6):
    """n unrelated 200-token prompts: together more than the pool can keep cached."""
    for seed in range(100, 100 + n):
        _generate(http, _ids(seed, 200))


def _check_pool(info):
    mem = info["memory"]
    parts = ("free", "evictable", "protected", "pinned", "held")
    assert sum(mem[k] for k in parts) == mem["total"], mem
    assert info["sessions"]["pinned_tokens"] == mem["pinned"]


def test_session_turn_keeps_its_prefix_and_matches_plain_request(http):
    sid = http.post("/open_session", json={"capacity_of_str_len": 1000}).json()
    assert isinstance(sid, str) and sid
    prompt = _ids(1, 100)
    first = _generate(http, prompt, {"id": sid})
    full = prompt + first["output_ids"]
    info = wait_idle(http)
    _check_pool(info)
    assert info["sessions"]["sessions_open"] == 1
    assert info["memory"]["pinned"] == len(full) - 1  # the last token's KV is never computed
    _traffic(http)
    new = _ids(2, 5)
    second = _generate(http, new, {"id": sid, "rid": first["meta_info"]["id"]})
    assert second["meta_info"]["prompt_tokens"] == len(full) + len(new)
    assert second["meta_info"]["cached_tokens"] == len(full) - 1
    assert http.post("/close_session", json={"session_id": sid}).status_code == 200
    info = wait_idle(http)
    _check_pool(info)
    assert info["memory"]["pinned"] == 0 and info["sessions"]["sessions_open"] == 0
    plain = _generate(http, full + new)
    assert plain["output_ids"] == second["output_ids"]


def test_bad_session_ids_are_400(http):
    sid = http.post("/open_session", json={"capacity_of_str_len": 10, "session_id": "s1"})
    assert sid.json() == "s1"
    again = http.post("/open_session", json={"capacity_of_str_len": 10, "session_id": "s1"})
    assert again.status_code == 400 and again.json()["error"]["param"] == "session_id"
    first = _generate(http, _ids(3, 10), {"id": "s1"})
    body = {"input_ids": _ids(4, 3), "sampling_params": GREEDY}
    for session, param in [
        ({"id": "nope"}, "session_params.id"),
        ({"id": "s1", "rid": "nope"}, "session_params.rid"),
    ]:
        r = http.post("/generate", json={**body, "session_params": session})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert http.post("/close_session", json={"session_id": "s1"}).status_code == 200
    closed = http.post("/close_session", json={"session_id": "s1"})
    assert closed.status_code == 400 and closed.json()["error"]["param"] == "session_id"
    r = http.post(
        "/generate",
        json={**body, "session_params": {"id": "s1", "rid": first["meta_info"]["id"]}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_params.id"
    stream = http.post("/generate", json={**body, "stream": True, "session_params": {"id": "x"}})
    assert stream.status_code == 400
    info = wait_idle(http)
    _check_pool(info)
    assert info["memory"]["pinned"] == 0


def test_responses_continuation_keeps_its_prefix_hot(http):
    text = " ".join(f"item {i} is a {['red', 'blue', 'green'][i % 3]} box;" for i in range(40))
    first = http.post(
        "/v1/responses",
        json={"model": MODEL, "input": text, "max_output_tokens": 8, "temperature": 0},
    ).json()
    assert wait_idle(http)["memory"]["pinned"] > first["usage"]["input_tokens"]
    _traffic(http)
    second = http.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "Which item is green?",
            "previous_response_id": first["id"],
            "max_output_tokens": 4,
            "temperature": 0,
        },
    ).json()
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["input_tokens"], (cached, first["usage"])
    _check_pool(wait_idle(http))


def test_openapi_documents_the_session_routes(http):
    paths = http.get("/openapi.json").json()["paths"]
    body = paths["/open_session"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].endswith("/OpenSessionRequest")
    assert "400" in paths["/close_session"]["post"]["responses"]


def test_deleting_a_stored_response_releases_its_pin(http):
    body = {"model": MODEL, "input": "Name three colours.", "max_output_tokens": 4}
    first = http.post("/v1/responses", json={**body, "temperature": 0}).json()
    pins = wait_idle(http)["sessions"]["pins"]
    assert pins >= 1
    assert http.delete(f"/v1/responses/{first['id']}").json()["deleted"] is True
    info = wait_idle(http)
    assert info["sessions"]["pins"] == pins - 1
    _check_pool(info)
