"""`radixlm serve --dp-size 2 --dp-policy round_robin`: requests alternate between the
replicas (n > 1 choices too), and every greedy output equals the one-replica Engine's."""

from __future__ import annotations

import re

import httpx
import pytest

from .conftest import COMPLETION_MAX, COMPLETION_PROMPT, running_server
from .test_data_parallel import DP, _routed


def _completion(http, n=1) -> list[str]:
    body = {"model": "smollm2-135m", "prompt": COMPLETION_PROMPT, "max_tokens": COMPLETION_MAX}
    r = http.post("/v1/completions", json={**body, "temperature": 0, "n": n})
    assert r.status_code == 200, r.text
    return [c["text"] for c in r.json()["choices"]]


@pytest.fixture(scope="module")
def round_robin():
    with running_server(*DP, "--dp-policy", "round_robin") as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


def test_round_robin_alternates_with_greedy_outputs_equal_to_one_replica(round_robin, engine_ref):
    http = round_robin
    texts = [_completion(http)[0] for _ in range(4)]
    assert _routed(http) == [2, 2]
    assert texts == [engine_ref["completion"]["text"]] * 4
    # n > 1 fans out as one request per choice, alternating too; greedy choices agree.
    assert _completion(http, n=2) == [engine_ref["completion"]["text"]] * 2
    assert _routed(http) == [3, 3]
    metrics = http.get("/metrics").text
    assert re.search(r'replica_requests_routed_total\{dp_rank="1"\} 3\.0', metrics)
