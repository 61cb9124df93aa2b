"""Admission limits over HTTP: a full waiting queue answers 503 at once, and the server
keeps serving the requests it accepted."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.frontend.conftest import running_server, wait_idle


@pytest.fixture(scope="module")
def small_server():
    with running_server("--max-running-requests", "1", "--max-queued-requests", "1") as url:
        yield url


def test_full_queue_is_503_and_accepted_requests_finish(small_server):
    first_token = threading.Event()
    release = threading.Event()
    body = {"prompt": "Count slowly:", "max_tokens": 400, "ignore_eos": True, "temperature": 0}

    def running() -> None:  # holds the only running slot until released, then disconnects
        with httpx.Client(base_url=small_server, timeout=120) as c:
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                lines = r.iter_lines()  # keep a reference: a dropped iterator closes the stream
                next(lines)
                first_token.set()
                release.wait(60)

    def queued() -> httpx.Response:
        with httpx.Client(base_url=small_server, timeout=120) as c:
            return c.post("/v1/completions", json={**body, "max_tokens": 8})

    with httpx.Client(base_url=small_server, timeout=120) as http, ThreadPoolExecutor(2) as pool:
        holder = pool.submit(running)
        assert first_token.wait(120)
        waiter = pool.submit(queued)
        info: dict = {}
        for _ in range(400):
            info = http.get("/get_server_info").json()
            if info["num_waiting"] == 1:
                break
        assert info["num_running"] == 1 and info["num_waiting"] == 1, info["scheduler"]
        refused = http.post("/v1/completions", json=body)
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert "queue" in error["message"].lower() and error["code"] == "queue_full"
        release.set()  # the holder disconnects: its request is aborted, the queued one runs
        holder.result(60)
        done = waiter.result(120)
        assert done.status_code == 200
        assert done.json()["usage"]["completion_tokens"] == 8
        mem = wait_idle(http)["memory"]
        assert mem["free"] + mem["evictable"] + mem["protected"] + mem["held"] == mem["total"]
