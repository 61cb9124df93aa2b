"""The soak driver's plan and summary without a server: the mix is reproducible and
covers what the soak promises; counts and latencies add up (tests/frontend/test_soak.py
runs it against a real server)."""

from __future__ import annotations

import pytest

from radixlm.bench.server_checks import pool_balanced
from radixlm.bench.soak import SoakOutcome, format_soak, soak_plan, summarize_soak


def test_plan_is_reproducible_and_mixed():
    plan = soak_plan(200, seed=3, abort_rate=0.25)
    assert plan == soak_plan(200, seed=3, abort_rate=0.25)
    assert plan != soak_plan(200, seed=4, abort_rate=0.25)
    assert [r.index for r in plan] == list(range(200))
    assert {r.route for r in plan} == {"chat", "completion"}
    assert {r.stream for r in plan} == {True, False}
    assert {r.n for r in plan} == {1, 2}
    aborts = [r for r in plan if r.abort]
    assert 30 <= len(aborts) <= 70  # 25% of 200, give or take the draw
    assert {r.abort for r in aborts} == {"mid_stream", "timeout"}
    for r in plan:
        assert r.stream or r.abort != "mid_stream"
        assert r.n == 1 or r.temperature > 0
        if r.abort == "mid_stream":
            assert 1 <= r.abort_after_chunks <= 3 and r.timeout_s == 0
        elif r.abort == "timeout":
            assert 0.05 <= r.timeout_s <= 0.5 and r.abort_after_chunks == 0
        if r.abort:
            assert r.max_tokens == 48 and r.ignore_eos
        else:
            assert 4 <= r.max_tokens <= 24
    assert all(r.abort is None for r in soak_plan(50, abort_rate=0.0))


def test_bodies_name_the_route_fields():
    chat = next(r for r in soak_plan(20) if r.route == "chat")
    text = next(r for r in soak_plan(20) if r.route == "completion")
    assert chat.path == "/v1/chat/completions" and text.path == "/v1/completions"
    body = chat.body("m")
    assert body["messages"] == [{"role": "user", "content": chat.text}] and "prompt" not in body
    assert body["model"] == "m" and body["n"] == chat.n and body["max_tokens"] == chat.max_tokens
    assert text.body("m")["prompt"] == text.text


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_plan_refuses_a_bad_rate(rate):
    with pytest.raises(ValueError, match="abort_rate"):
        soak_plan(10, abort_rate=rate)


def test_summary_counts_and_percentiles():
    plan = soak_plan(5, seed=0)
    outcomes = [
        SoakOutcome(0, "completed", 1.0),
        SoakOutcome(1, "completed", 3.0),
        SoakOutcome(2, "aborted", 0.2, "timeout"),
        SoakOutcome(3, "aborted", 0.3, "mid_stream"),
        SoakOutcome(4, "failed", 0.1, "HTTP 500: boom"),
    ]
    s = summarize_soak(plan, outcomes, wall_s=4.0)
    assert s["requests"] == 5 and s["completed"] == 2 and s["failed"] == 1
    assert s["aborted"] == {"mid_stream": 1, "timeout": 1}
    assert s["failures"] == {"HTTP 500: boom": 1}
    assert s["latency_ms"] == {"p50": 2000.0, "p99": 2980.0, "max": 3000.0}
    assert s["completed_per_s"] == 0.5
    assert s["mix"]["chat"] + s["mix"]["completion"] == 5
    table = format_soak(s)
    assert "| 5 | 2 | 1 | 1 | 1 | 2000.0 | 2980.0 | 3000.0 | 4.0 |" in table
    assert "failed x1: HTTP 500: boom" in table


def test_pool_balanced():
    assert pool_balanced({"free": 5, "evictable": 3, "protected": 1, "held": 1, "total": 10})
    assert not pool_balanced({"free": 5, "evictable": 3, "protected": 1, "held": 2, "total": 10})
