"""The bench client's arithmetic on synthetic timings: percentiles, TPOT, goodput, cache
hit rate, throughputs, arrival times, and the sweep's knee and operating point."""

from __future__ import annotations

import math

import pytest

from radixlm.bench.runner import arrival_offsets
from radixlm.bench.stats import (
    RequestResult,
    cache_hit_rate,
    distribution_ms,
    format_summary,
    goodput,
    percentile,
    summarize,
)
from radixlm.bench.sweep import analyze, knee_index, operating_point, parse_rates


def req(ttft: float, e2e: float, out: int, prompt: int = 10, cached: int | None = None, ok=True):
    return RequestResult(
        success=ok, prompt_tokens=prompt, output_tokens=out, cached_tokens=cached,
        ttft=ttft, e2e=e2e, itl=[(e2e - ttft) / (out - 1)] * (out - 1) if out > 1 else [],
    )  # fmt: skip


def test_percentile_interpolates_linearly():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)  # 9 + 0.1 * (10 - 9)
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile([4.0], 99) == 4.0
    assert percentile([], 50) is None


def test_distribution_is_in_milliseconds():
    d = distribution_ms([0.1, 0.2, 0.3])
    assert d["mean"] == pytest.approx(200.0)
    assert d["p50"] == pytest.approx(200.0)
    assert d["p90"] == pytest.approx(280.0)
    assert distribution_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_tpot_excludes_first_token():
    assert req(0.5, 1.5, 11).tpot == pytest.approx(0.1)
    assert req(0.5, 0.5, 1).tpot is None


def test_goodput_needs_both_slos():
    results = [
        req(0.1, 1.1, 11),  # ttft 100 ms, tpot 100 ms: good
        req(0.3, 1.3, 11),  # ttft 300 ms: misses the TTFT SLO
        req(0.1, 3.1, 11),  # tpot 300 ms: misses the TPOT SLO
        req(0.2, 0.2, 1),  # one token: no TPOT, TTFT 200 ms: good
    ]
    g = goodput(results, duration_s=4.0, slo_ttft_ms=200, slo_tpot_ms=150)
    assert g["good_requests"] == 2
    assert g["fraction"] == 0.5
    assert g["rate_rps"] == 0.5
    assert goodput(results, 4.0, None, None)["good_requests"] == 4
    assert goodput(results, 4.0, None, 150)["good_requests"] == 3


def test_cache_hit_rate_only_counts_reporting_servers():
    assert (
        cache_hit_rate(
            [req(0.1, 1, 2, prompt=100, cached=60), req(0.1, 1, 2, prompt=100, cached=0)]
        )
        == 0.3
    )
    assert cache_hit_rate([req(0.1, 1, 2, prompt=100)]) is None


def test_summarize_counts_and_throughputs():
    results = [req(0.1, 1.1, 11, prompt=20, cached=10), req(0.2, 2.2, 21, prompt=30, cached=0)]
    results.append(RequestResult(error="HTTP 500"))
    s = summarize(results, duration_s=2.5, slo_ttft_ms=150, slo_tpot_ms=200)
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["input_tokens"] == 50 and s["output_tokens"] == 32
    assert s["request_throughput"] == pytest.approx(0.8)
    assert s["output_throughput"] == pytest.approx(12.8)
    assert s["input_throughput"] == pytest.approx(20.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(150.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(100.0)
    assert s["itl_ms"]["mean"] == pytest.approx(100.0)  # 10 + 20 gaps of 100 ms
    assert s["e2e_ms"]["p99"] == pytest.approx(1100 + 0.99 * 1100)
    assert s["cache_hit_rate"] == pytest.approx(10 / 50)
    assert s["goodput"]["good_requests"] == 1
    assert s["errors"] == ["HTTP 500"]
    assert "Output throughput (tok/s)" in format_summary(s)


def test_arrivals_are_poisson_or_all_at_once():
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    times = arrival_offsets(20000, 4.0, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.05)
    with pytest.raises(ValueError):
        arrival_offsets(1, 0.0)


def test_knee_is_last_point_within_twice_low_load_latency():
    assert knee_index([100, 120, 190, 210, 500]) == 2
    assert knee_index([100, 150, 180]) == 2  # never saturates: the last point
    assert knee_index([100, 300]) == 0
    assert knee_index([None, 100, 150, 400]) == 2
    assert knee_index([None, None]) is None


def point(rate, tput, ttft99, tpot99):
    return {"request_rate": rate, "output_throughput": tput,
            "ttft_ms": {"p99": ttft99}, "tpot_ms": {"p99": tpot99}}  # fmt: skip


def test_operating_point_is_best_throughput_meeting_slos():
    pts = [
        point(1, 10, 100, 50),
        point(2, 19, 150, 60),
        point(4, 30, 900, 90),
        point(8, 31, 5000, 200),
    ]
    assert operating_point(pts, slo_ttft_ms=1000, slo_tpot_ms=100) == 2
    assert operating_point(pts, slo_ttft_ms=200, slo_tpot_ms=None) == 1
    assert operating_point(pts, slo_ttft_ms=50, slo_tpot_ms=None) is None
    assert operating_point(pts, None, None) is None
    a = analyze(pts, 1000, 100)
    assert a["knee_tpot_rate"] == 4 and a["knee_ttft_rate"] == 2 and a["operating_rate"] == 4


def test_parse_rates():
    assert parse_rates("4, 1,inf") == [1.0, 4.0, math.inf]
    for bad in ("", "0,1", "-2", "nan", "1,nan", "1,x"):
        with pytest.raises(ValueError, match="--sweep-rate needs positive rates"):
            parse_rates(bad)


def test_failed_requests_are_counted_by_error():
    results = [req(0.1, 1.1, 11)]
    results += [RequestResult(error="HTTP 401: bad key")] * 2
    results += [RequestResult(error="ConnectError: refused")] * 3 + [RequestResult()]
    s = summarize(results, duration_s=1.0)
    assert s["failed"] == 6
    assert s["error_counts"] == {
        "ConnectError: refused": 3,
        "HTTP 401: bad key": 2,
        "unknown error": 1,
    }
    assert list(s["error_counts"]) == ["ConnectError: refused", "HTTP 401: bad key",
                                       "unknown error"]  # fmt: skip
    text = format_summary(s)
    assert text.endswith(
        "Failed requests by error:\n     3 x ConnectError: refused\n     2 x HTTP 401: bad key"
        "\n     1 x unknown error\n" + "=" * 44
    )
    assert "by error" not in format_summary(summarize(results[:1], 1.0))


def test_many_distinct_errors_are_summed_past_five_lines():
    results = [RequestResult(error=f"error {i}") for i in range(7)] * 2
    lines = format_summary(summarize(results, 1.0)).splitlines()
    start = lines.index("Failed requests by error:")
    assert lines[start + 1 : -1] == [
        "     2 x error 0",
        "     2 x error 1",
        "     2 x error 2",
        "     2 x error 3",
        "     6 x 3 other errors",
    ]
