"""`radixlm serve --dp-size 2` on the bundled model: greedy outputs equal the one-replica
Engine's, cache-aware routing keeps a shared-prefix follow-up on its replica, round_robin
alternates, and per-replica counters, sessions, n > 1, aborts and /flush_cache work across
replicas. round_robin: test_data_parallel_rr.py (one server per module: 2 schedulers,
1 detokenizer)."""

from __future__ import annotations

import threading

import httpx
import pytest

from .conftest import running_server, wait_idle

DP = ("--dp-size", "2", "--max-total-tokens", "4000")
PREFIX = (
    "You are a meticulous assistant for a logistics company. Answer briefly and cite the "
    "warehouse code of every item you mention. "
)


def _gen(http, text, max_new=6, **extra):
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}
    r = http.post("/generate", json={**body, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _routed(http) -> list[int]:
    return [r["requests_routed"] for r in http.get("/get_server_info").json()["replicas"]]


@pytest.fixture(scope="module")
def cache_aware():
    args = (*DP, "--dp-balance-threshold", "100")
    with running_server(*args) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


def test_cache_aware_routes_shared_prefix_to_its_replica(cache_aware):
    http = cache_aware
    first = _gen(http, PREFIX + "Where are the blue crates?")
    other = _gen(http, "Once upon a time in a land far away")
    assert _routed(http) == [1, 1]  # the unrelated prompt went to the empty replica
    follow = _gen(http, PREFIX + "And the red pallets?")
    assert _routed(http) == [2, 1]
    assert follow["meta_info"]["cached_tokens"] >= len(PREFIX) // 8
    assert other["meta_info"]["cached_tokens"] == 0
    info = wait_idle(http)
    r0, r1 = info["replicas"]
    prompt0 = first["meta_info"]["prompt_tokens"] + follow["meta_info"]["prompt_tokens"]
    assert r0["cache_hit_rate"] == pytest.approx(follow["meta_info"]["cached_tokens"] / prompt0)
    assert r1["cache_hit_rate"] == 0.0
    assert (r0["num_running"], r0["num_waiting"], r1["num_running"]) == (0, 0, 0)
    assert info["dp_size"] == 2 and set(info["liveness"]) == {
        "scheduler-0",
        "scheduler-1",
        "detokenizer",
    }
    metrics = http.get("/metrics").text
    assert 'radixlm:replica_requests_routed_total{dp_rank="0"} 2.0' in metrics
    assert 'radixlm:replica_requests_routed_total{dp_rank="1"} 1.0' in metrics
    assert 'radixlm:replica_cache_hit_rate{dp_rank="1"} 0.0' in metrics
    assert 'radixlm:replica_num_running_reqs{dp_rank="0"} 0.0' in metrics


def test_session_turns_stay_on_their_replica(cache_aware):
    http = cache_aware
    sid = http.post("/open_session", json={"capacity_of_str_len": 1000}).json()
    before = _routed(http)
    turn1 = _gen(http, "Count: one two three", session_params={"id": sid})
    rid1 = turn1["meta_info"]["id"]
    _gen(http, " four", session_params={"id": sid, "rid": rid1})
    after = _routed(http)
    assert sorted(a - b for a, b in zip(after, before)) == [0, 2]
    assert http.post("/close_session", json={"session_id": sid}).status_code == 200


def test_flush_cache_flushes_every_replica(cache_aware):
    http = cache_aware
    wait_idle(http)
    assert http.post("/flush_cache").status_code == 200
    info = http.get("/get_server_info").json()
    assert [r["memory"]["evictable"] for r in info["replicas"]] == [0, 0]


def test_abort_reaches_the_replica_holding_the_request(cache_aware):
    http = cache_aware
    body = {
        "text": "Tell me a long story",
        "rid": "long-one",
        "sampling_params": {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True},
    }
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=http.post("/generate", json=body)))
    thread.start()
    for _ in range(200):
        r = http.post("/abort_request", json={"rid": "long-one"})
        if r.status_code == 200:
            break
        threading.Event().wait(0.05)
    assert r.json() == {"aborted": ["long-one"]}
    thread.join(60)
    assert result["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(http)
