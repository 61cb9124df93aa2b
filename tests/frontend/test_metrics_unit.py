"""ServerMetrics on scripted batches with explicit clock values: exact observations."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixlm.frontend.metrics import ServerMetrics
from radixlm.runtime.server.messages import BatchStrOut


def batch(rows, queue_times=None):
    """rows: (rid, new_ids, finish_reason, prompt, completion, cached)."""
    return BatchStrOut(
        rids=[r[0] for r in rows],
        new_token_ids=[r[1] for r in rows],
        finish_reasons=[r[2] for r in rows],
        matched_stops=[None for _ in rows],
        prompt_tokens=[r[3] for r in rows],
        completion_tokens=[r[4] for r in rows],
        cached_tokens=[r[5] for r in rows],
        texts=["" for _ in rows],
        queue_times=queue_times or [0.0 for _ in rows],
    )


def samples(m: ServerMetrics, stats=None) -> dict:
    text = m.render(stats).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_two_requests_exact_observations():
    m = ServerMetrics()
    m.on_submit("a", 10.0)
    m.on_submit("b", 10.0)
    m.on_batch(batch([("a", [5], None, 7, 1, 3), ("b", [6], None, 4, 1, 0)], [0.25, 0.5]), 10.5)
    m.on_batch(batch([("a", [8, 9], None, 7, 3, 3), ("b", [1], "stop", 4, 2, 0)]), 10.7)
    m.on_batch(batch([("a", [2], "length", 7, 4, 3)]), 11.0)
    m.on_batch(batch([("ghost", [1], "abort", 1, 1, 0)]), 11.0)  # unknown rid: ignored
    s = samples(m)
    assert s["radixlm:time_to_first_token_seconds_count"] == 2
    assert s["radixlm:time_to_first_token_seconds_sum"] == pytest.approx(1.0)
    # a: 2 tokens in one message 0.2 s after its first -> 2 x 0.1; then 0.3; b: 0.2
    assert s["radixlm:inter_token_latency_seconds_count"] == 4
    assert s["radixlm:inter_token_latency_seconds_sum"] == pytest.approx(0.2 + 0.3 + 0.2)
    # TPOT a: (11.0 - 10.5) / 3, b: (10.7 - 10.5) / 1
    assert s["radixlm:time_per_output_token_seconds_sum"] == pytest.approx(0.5 / 3 + 0.2)
    assert s["radixlm:e2e_request_latency_seconds_sum"] == pytest.approx(1.0 + 0.7)
    assert s["radixlm:queue_time_seconds_sum"] == pytest.approx(0.75)
    assert s["radixlm:queue_time_seconds_count"] == 2
    assert s["radixlm:prompt_tokens_total"] == 11
    assert s["radixlm:cached_tokens_total"] == 3
    assert s["radixlm:generation_tokens_total"] == 6
    assert s["radixlm:requests_total{finish_reason=length}"] == 1
    assert s["radixlm:requests_total{finish_reason=stop}"] == 1


def test_abandoned_and_refused_requests():
    m = ServerMetrics()
    m.on_submit("gone", 0.0)
    m.on_submit("refused", 0.0)
    m.on_abandoned("gone", 1.0, refused=False)
    m.on_abandoned("refused", 1.0, refused=True)
    s = samples(m)
    assert s["radixlm:requests_total{finish_reason=abort}"] == 1
    assert "radixlm:requests_total{finish_reason=stop}" not in s
    assert s["radixlm:e2e_request_latency_seconds_count"] == 0


def test_scheduler_gauges_and_counters_come_from_stats():
    stats = {"num_running": 3, "num_waiting": 2, "token_usage": 0.25, "cache_hit_rate": 0.5,
             "total": 1000, "num_retracted_total": 4, "num_aborted_total": 1}  # fmt: skip
    s = samples(ServerMetrics(), stats)
    assert s["radixlm:num_running_reqs"] == 3
    assert s["radixlm:num_queue_reqs"] == 2
    assert s["radixlm:token_usage"] == 0.25
    assert s["radixlm:cache_hit_rate"] == 0.5
    assert s["radixlm:max_total_tokens"] == 1000
    assert s["radixlm:retractions_total"] == 4
    assert s["radixlm:aborts_total"] == 1


def test_registries_are_per_instance():
    a, b = ServerMetrics(), ServerMetrics()
    a.on_submit("x", 0.0)
    a.on_batch(batch([("x", [1], "length", 2, 1, 0)]), 1.0)
    assert samples(a)["radixlm:requests_total{finish_reason=length}"] == 1
    assert "radixlm:requests_total{finish_reason=length}" not in samples(b)
