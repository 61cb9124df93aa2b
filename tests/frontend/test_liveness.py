"""Liveness: /health follows the children's heartbeats, and --request-timeout ends requests
that a frozen scheduler never answers, freeing their KV once it runs again.

The scheduler process is frozen with SIGSTOP (every thread stops, its heartbeat thread
too) and always resumed with SIGCONT in a `finally`.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil
import pytest

from tests.frontend.conftest import MODEL, sse_payloads, start_server, stop_server, wait_idle

HEALTH_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 3.0
# A heartbeat can be up to its 0.5 s interval old when the process freezes.
HEARTBEAT_S = 0.5
SLACK_S = 8.0  # scheduling delays of a loaded test machine


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[str, psutil.Process]]:
    """(base URL, scheduler process) of a server with short liveness bounds."""
    proc, url = start_server(
        "--health-timeout", str(HEALTH_TIMEOUT_S), "--request-timeout", str(REQUEST_TIMEOUT_S)
    )
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        yield url, max(children, key=lambda c: c.memory_info().rss)  # it holds the model
    finally:
        stop_server(proc)


@pytest.fixture
def http(live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live[0], timeout=60) as client:
        yield client


@contextmanager
def frozen(process: psutil.Process) -> Iterator[None]:
    """`process` stopped (SIGSTOP) for the block, resumed (SIGCONT) whatever happens."""
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def _wait_health(http: httpx.Client, status: int, within: float) -> httpx.Response:
    deadline = time.monotonic() + within
    while True:
        r = http.get("/health")
        if r.status_code == status or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def _completion() -> dict:
    return {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}


def _assert_timeout_body(body: dict) -> None:
    err = body["error"]
    assert err["type"] == "server_error"
    assert err["code"] == "request_timeout"
    assert "--request-timeout (3 s)" in err["message"]


def test_health_follows_the_scheduler_heartbeat(live, http):
    _, scheduler = live
    assert http.get("/health").status_code == 200
    start = time.monotonic()
    with frozen(scheduler):
        r = _wait_health(http, 503, HEALTH_TIMEOUT_S + SLACK_S)
        silent_after = time.monotonic() - start
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "unhealthy"
        # The detokenizer still beats; only the scheduler is named.
        assert "scheduler process silent for" in err["message"]
        assert "detokenizer" not in err["message"]
        assert silent_after >= HEALTH_TIMEOUT_S - HEARTBEAT_S
    r = _wait_health(http, 200, SLACK_S)
    assert r.status_code == 200, r.text
    liveness = http.get("/get_server_info").json()["liveness"]
    assert set(liveness) == {"scheduler", "detokenizer"}
    assert liveness["scheduler"]["last_heard_s"] < HEALTH_TIMEOUT_S


@pytest.mark.parametrize("stream", [False, True])
def test_request_timeout_while_the_scheduler_is_frozen(live, http, stream):
    _, scheduler = live
    with frozen(scheduler):
        start = time.monotonic()
        r = http.post("/v1/completions", json={**_completion(), "stream": stream})
        elapsed = time.monotonic() - start
        # No token came before the deadline, so even a stream answers with a status.
        assert r.status_code == 504, r.text
        _assert_timeout_body(r.json())
        assert REQUEST_TIMEOUT_S - 0.1 <= elapsed <= REQUEST_TIMEOUT_S + SLACK_S
        info = http.get("/get_server_info")  # a control call is bounded too
        assert info.status_code == 504, info.text
        _assert_timeout_body(info.json())
    # The aborts reached the scheduler with the requests: nothing runs, waits or holds KV.
    mem = wait_idle(http)["memory"]
    assert mem["held"] == 0
    assert mem["free"] + mem["evictable"] + mem["protected"] == mem["total"]
    r = http.post("/v1/completions", json=_completion())
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def test_stream_ends_with_a_timeout_event_when_frozen_mid_stream(live, http):
    _, scheduler = live
    body = {**_completion(), "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[len("data: ") :])["object"] == "text_completion"
        with frozen(scheduler):
            rest = sse_payloads(lines)
    assert rest[-1] == "[DONE]"
    events = [json.loads(p) for p in rest[:-1]]
    assert "error" in events[-1], events[-1]
    _assert_timeout_body(events[-1])
    assert all("error" not in e for e in events[:-1])
    mem = wait_idle(http)["memory"]
    assert mem["held"] == 0
