"""GET /metrics against a real server for a scripted sequence of requests (exact counts),
then `radixlm bench` end to end against the same server (one server for the module).

The metrics test must run first: the server's cache hit rate covers its whole life."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.frontend.conftest import MODEL, running_server, wait_idle

pytestmark = pytest.mark.slow

PROMPT = "Metrics test: the quick brown fox jumps over the lazy dog near the river bank."
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server() as base:
        yield base


@pytest.fixture(scope="module")
def http(url) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as client:
        yield client


def scrape(http: httpx.Client) -> dict[str, float]:
    resp = http.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_metrics_match_a_scripted_sequence(http, tokenizer):
    n = len(tokenizer.encode(PROMPT, add_special_tokens=False))
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    cached = []
    for _ in range(3):  # sequential: the 2nd and 3rd hit the 1st one's cached prompt
        usage = http.post("/v1/completions", json=body).json()["usage"]
        assert usage["prompt_tokens"] == n and usage["completion_tokens"] == MAX_TOKENS
        cached.append(usage["prompt_tokens_details"]["cached_tokens"])
    # The whole prompt is cached except its last token, which must be recomputed to
    # give the logits of the first output token.
    assert cached == [0, n - 1, n - 1]
    # A streamed request whose client leaves after the first chunk is aborted.
    with http.stream(
        "POST", "/v1/completions", json={**body, "max_tokens": 500, "stream": True}
    ) as r:
        next(r.iter_lines())
    wait_idle(http)
    s = scrape(http)
    assert s["radixlm:prompt_tokens_total"] == 4 * n
    assert s["radixlm:cached_tokens_total"] == 3 * (n - 1)
    assert s["radixlm:requests_total{finish_reason=length}"] == 3
    assert s["radixlm:requests_total{finish_reason=abort}"] == 1
    assert s["radixlm:aborts_total"] == 1
    assert s["radixlm:retractions_total"] == 0
    assert s["radixlm:time_to_first_token_seconds_count"] == 4
    assert s["radixlm:queue_time_seconds_count"] == 4
    assert s["radixlm:e2e_request_latency_seconds_count"] == 3
    assert s["radixlm:time_per_output_token_seconds_count"] == 3
    gen = s["radixlm:generation_tokens_total"]
    streamed = gen - 3 * MAX_TOKENS  # tokens the aborted request produced before it left
    assert streamed >= 1
    assert s["radixlm:inter_token_latency_seconds_count"] == 3 * (MAX_TOKENS - 1) + streamed - 1
    assert s["radixlm:num_running_reqs"] == 0
    assert s["radixlm:num_queue_reqs"] == 0
    assert s["radixlm:token_usage"] == 0
    assert s["radixlm:cache_hit_rate"] == pytest.approx(3 * (n - 1) / (4 * n))
    assert s["radixlm:max_total_tokens"] == 20000


def run_bench(url: str, tmp_path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "radixlm", "bench", "--base-url", url, "--disable-tqdm",
           "--output-json", str(out), *flags]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


def test_bench_random_native_writes_valid_json(url, tmp_path):
    proc, report = run_bench(url, tmp_path, "--num-prompts", "3", "--random-input-len", "16",
                             "--random-output-len", "4", "--slo-ttft-ms", "1e9",
                             "--slo-tpot-ms", "1e9")  # fmt: skip
    s = report["summary"]
    assert s["completed"] == 3 and s["failed"] == 0
    assert s["output_tokens"] == 12
    assert [r["output_tokens"] for r in report["requests"]] == [4, 4, 4]
    assert s["goodput"]["fraction"] == 1.0
    assert s["ttft_ms"]["p50"] > 0 and s["tpot_ms"]["p99"] > 0
    assert "Output throughput (tok/s)" in proc.stdout


def test_bench_multi_turn_openai_hits_the_cache(url, tmp_path):
    _, report = run_bench(url, tmp_path, "--backend", "openai", "--dataset-name", "multi-turn",
                          "--num-prompts", "2", "--multi-turn-num-turns", "2",
                          "--multi-turn-system-len", "32", "--multi-turn-turn-len", "8",
                          "--multi-turn-output-len", "3", "--max-concurrency", "2")  # fmt: skip
    s = report["summary"]
    assert s["completed"] == 4 and s["output_tokens"] == 12
    assert report["config"]["model"] == MODEL
    # Second turns resend the first turn's prompt and answer: mostly cache hits.
    second = [r for r in report["requests"]][1::2]
    assert all(r["cached_tokens"] > 32 for r in second)
    assert s["cache_hit_rate"] > 0.3


def test_bench_unreachable_server_is_a_clean_error():
    cmd = [sys.executable, "-m", "radixlm", "bench", "--backend", "openai",
           "--base-url", "http://127.0.0.1:9"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "cannot reach http://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr
