"""SLO admission control over HTTP: a TTFT target the queue cannot meet is refused with
429 and Retry-After (--slo-admission reject); per-request targets and priorities are
taken on /v1/completions, /v1/chat/completions and /generate; /get_server_info and
/metrics report the step-time model and the goodput counters."""

from __future__ import annotations

import httpx
import pytest

from tests.frontend.conftest import running_server, wait_idle

# Before any step is measured the model predicts 100 ms per step: a 1 ms TTFT target
# cannot be met (and after real steps neither).
FLAGS = ("--slo-ttft-ms", "1", "--slo-admission", "reject", "--slo-step-prior", "100,0,0")


@pytest.fixture(scope="module")
def http():
    with running_server(*FLAGS) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


def test_unattainable_ttft_is_429_and_overrides_run(http):
    refused = http.post(
        "/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}
    )
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) == 1  # 0.099 s predicted excess, rounded up
    assert refused.json()["error"]["code"] == "slo_unattainable"

    slack = {"slo_ttft_ms": 1e6, "slo_tpot_ms": 1e6}
    gen = http.post(
        "/generate",
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 3}, "priority": 2, **slack},
    )
    assert gen.status_code == 200, gen.text
    chat = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 3,
            "priority": -1,
            **slack,
        },
    )
    assert chat.status_code == 200, chat.text
    bad = http.post("/v1/completions", json={"prompt": "Hi", "slo_ttft_ms": 0})
    assert bad.status_code == 400
    # /v1/responses takes the same extensions: the server's 1 ms target is refused, a
    # request's own slack target runs.
    body = {"input": "Hi", "max_output_tokens": 3, "temperature": 0, "store": False}
    refused = http.post("/v1/responses", json=body)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "slo_unattainable"
    resp = http.post("/v1/responses", json={**body, "priority": 1, **slack})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["output_tokens"] == 3

    slo = wait_idle(http)["slo"]
    assert slo["step_model"]["prior"] == [100.0, 0.0, 0.0]
    assert slo["step_model"]["steps_seen"] >= 2
    assert slo["slo_rejected_total"] == 2
    assert slo["slo_finished_total"] == 3 == slo["slo_both_met_total"]
    metrics = http.get("/metrics").text
    assert "radixlm:slo_rejected_total 2.0" in metrics
    assert "radixlm:slo_goodput_requests_total 3.0" in metrics


def test_cli_fills_the_step_prior_from_the_planner():
    """`radixlm serve --slo-ttft-ms` without --slo-step-prior: the scheduler's prior is the
    planner's roofline fit for the served model on this device. The planner measures the
    CPU in each process (and the least-squares terms shift with the measured ratio of
    bandwidth to FLOP/s), so the test compares predicted step times, which agree within a
    factor of 3 on a shared machine."""
    from radixlm.config_checks import parse_step_prior
    from radixlm.plan.step_prior import serving_step_prior

    expected = parse_step_prior(serving_step_prior("smollm2-135m", "cpu", "float32", "auto", None))
    assert expected is not None
    with running_server("--slo-ttft-ms", "60000") as url, httpx.Client(base_url=url) as client:
        prior = client.get("/get_server_info").json()["slo"]["step_model"]["prior"]
    assert prior is not None and len(prior) == 3

    def step_ms(terms, chunk, batch):
        return terms[0] + terms[1] * chunk + terms[2] * batch

    for chunk, batch in ((512, 0), (0, 32), (256, 8)):
        ratio = step_ms(prior, chunk, batch) / step_ms(expected, chunk, batch)
        assert 1 / 3 <= ratio <= 3, (prior, expected, chunk, batch)
