"""A server with speculative decoding: same greedy output as the plain engine, the
acceptance length in /generate meta_info and the counters in /get_server_info."""

from __future__ import annotations

import httpx
import pytest

from .conftest import COMPLETION_MAX, COMPLETION_PROMPT, running_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spec_http():
    with running_server("--speculative-algorithm", "ngram", "--speculative-topk", "2") as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


def test_generate_reports_acceptance_and_matches_engine(spec_http, engine_ref):
    ref = engine_ref["completion"]
    params = {"max_new_tokens": COMPLETION_MAX, "temperature": 0}
    out = spec_http.post("/generate", json={"text": COMPLETION_PROMPT, "sampling_params": params})
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["output_ids"] == ref["output_ids"] and body["text"] == ref["text"]
    assert body["meta_info"]["spec_accept_length"] >= 1.0
    stats = spec_http.get("/get_server_info").json()["scheduler"]
    assert stats["spec_verify_steps_total"] > 0
    assert stats["spec_accept_length"] >= 1.0 and 0.0 <= stats["spec_accept_rate"] <= 1.0
    # /metrics exposes the same scheduler figures as gauges.
    metrics = _gauges(spec_http.get("/metrics").text)
    assert metrics["radixlm:spec_accept_length"] == pytest.approx(stats["spec_accept_length"])
    assert metrics["radixlm:spec_accept_rate"] == pytest.approx(stats["spec_accept_rate"])
    assert 0.0 <= metrics["radixlm:spec_draft_time_share"] <= 1.0


def _gauges(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text exposition: name -> value."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()[:2]
            out[name] = float(value)
    return out
