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


def test_generate_n_beyond_what_the_server_holds_is_400(small_server):
    """1 running row + 1 queue slot: n = 3 copies could never be admitted, so the
    answer is a 400 naming n at once, not a 503 or a wait."""
    body = {"text": "Hi", "sampling_params": {"n": 3, "max_new_tokens": 2}}
    with httpx.Client(base_url=small_server, timeout=120) as http:
        r = http.post("/generate", json=body)
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "sampling_params.n" and "3 sequences" in err["message"]
        two = http.post(
            "/generate", json={**body, "sampling_params": {"n": 2, "max_new_tokens": 2}}
        )
        assert two.status_code == 200 and len(two.json()) == 2
        batch = http.post(
            "/generate",
            json={"text": ["Hi", "Yo"], "sampling_params": {"n": 2, "max_new_tokens": 2}},
        )
        assert batch.status_code == 400 and batch.json()["error"]["param"] == "sampling_params.n"
