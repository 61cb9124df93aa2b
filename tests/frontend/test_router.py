"""`radixlm router` in front of two `radixlm serve` workers on loopback: streaming
pass-through, abort forwarding on client disconnect, /tokenize and /detokenize (and so
`select`'s exact-id scoring) from a worker, a worker killed mid-run (every
request completes or gets an error, survivors keep serving, the dead worker is removed
and re-admitted after a restart), 503 with no healthy worker, and refusal of a URL that is
not a radixlm worker. Also the real `sglang-router` (PyPI) in front of the same workers,
when it is installed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

import radixlm as rl
from radixlm.lang.backend.runtime import ready_url
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint

from .conftest import start_server, stop_server

WORKER = ("--max-total-tokens", "4000")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _router(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "radixlm", "router", "--port", "0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(pred, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet():
    ports = [_free_port(), _free_port()]
    workers = [start_server(*WORKER, "--port", str(p))[0] for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    router = _router("--worker-urls", *urls, "--health-interval", "0.5")
    try:
        base = ready_url(router, 60)
        with httpx.Client(base_url=base, timeout=120) as client:
            yield {"http": client, "urls": urls, "workers": workers, "ports": ports}
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(30)
        for w in workers:
            stop_server(w)


def _info(http):
    return http.get("/get_server_info").json()


def _gen_body(text, n=8, **params):
    sp = {"max_new_tokens": n, "temperature": 0, **params}
    return {"text": text, "sampling_params": sp}


def test_refuses_a_url_that_is_not_a_radixlm_worker(fleet):
    proc = _router("--worker-urls", fleet["urls"][0] + "/not-a-worker")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"{fleet['urls'][0]}/not-a-worker is not a radixlm worker" in err


def test_streaming_pass_through_equals_the_worker(fleet):
    body = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 8}
    body |= {"temperature": 0, "stream": True}
    with fleet["http"].stream("POST", "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    direct = httpx.post(fleet["urls"][0] + "/v1/completions", json={**body, "stream": False})
    assert events[-1] == "[DONE]" and len(events) >= 9
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == direct.json()["choices"][0]["text"]


def test_client_disconnect_aborts_on_the_worker(fleet):
    http = fleet["http"]
    before = _info(http)["aborts_forwarded"]
    body = _gen_body("Tell me a very long story", 3000, ignore_eos=True) | {"stream": True}
    with http.stream("POST", "/generate", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    _wait(lambda: _info(http)["aborts_forwarded"] == before + 1, 10, "the forwarded abort")
    for url in fleet["urls"]:
        _wait(lambda url=url: httpx.get(url + "/get_server_info").json()["num_running"] == 0)
    aborted = [httpx.get(u + "/get_server_info").json()["scheduler"] for u in fleet["urls"]]
    assert sum(s["num_aborted_total"] for s in aborted) == 1


def test_tokenize_and_select_through_the_router_use_the_workers_ids(fleet):
    http, worker = fleet["http"], fleet["urls"][0]
    text = "The capital of France is"
    via = http.post("/tokenize", json={"prompt": text})
    assert via.status_code == 200
    assert via.json() == httpx.post(worker + "/tokenize", json={"prompt": text}).json()
    back = http.post("/detokenize", json={"tokens": via.json()["tokens"]})
    assert back.status_code == 200 and back.json()["prompt"] == text
    both = {"prompt": text, "messages": [{"role": "user", "content": "Hi"}]}
    refused = http.post("/tokenize", json=both)
    assert refused.status_code == 400
    assert refused.json() == httpx.post(worker + "/tokenize", json=both).json()

    @rl.function
    def pick(s):
        s += "Q: Is Paris in France?\nA:"
        s += rl.select("answer", choices=[" yes", " no", " maybe not"])

    routed, direct = RuntimeEndpoint(str(http.base_url)), RuntimeEndpoint(worker)
    got, want = pick.run(backend=routed), pick.run(backend=direct)
    # The router answers /tokenize, so select scored from exact ids (no lookback plan).
    assert routed._has_tokenize
    assert got["answer"] == want["answer"]
    meta = "normalized_prompt_logprobs"
    assert got.get_meta_info("answer")[meta] == want.get_meta_info("answer")[meta]


def test_sglang_router_serves_radixlm_workers_unchanged(fleet):
    pytest.importorskip("sglang_router")
    port = _free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--port", str(port)]
    cmd += ["--worker-urls", *fleet["urls"], "--policy", "cache_aware", "--log-level", "warn"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.post(base + "/generate", json=_gen_body("Hi", 2)).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(up, 60, "sglang-router")
        via = httpx.post(base + "/generate", json=_gen_body("The capital of France is"))
        direct = httpx.post(
            fleet["urls"][1] + "/generate", json=_gen_body("The capital of France is")
        )
        assert via.json()["output_ids"] == direct.json()["output_ids"]
        chat = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]}
        r = httpx.post(base + "/v1/chat/completions", json=chat | {"max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        proc.terminate()
        proc.wait(30)


def test_killed_worker_loses_no_request_and_is_readmitted(fleet):
    http = fleet["http"]
    results: list = [None] * 6

    def send(i: int) -> None:
        body = _gen_body(f"Request number {i}: write a poem about rivers", 60, ignore_eos=True)
        try:
            results[i] = http.post("/generate", json=body).status_code
        except httpx.HTTPError as e:
            results[i] = e

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    _wait(lambda: sum(w["in_flight"] for w in _info(http)["workers"]) == 6, 30, "dispatch")
    victim = fleet["workers"][1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(30)
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a request hung"
    assert all(code in (200, 502) for code in results), results  # completed or an error
    assert 200 in results
    # Survivors keep serving; new requests never reach the dead worker (retried or routed).
    for i in range(3):
        assert http.post("/generate", json=_gen_body(f"after {i}", 4)).status_code == 200
    _wait(lambda: not _info(http)["workers"][1]["healthy"], 10, "removal")
    # Restarted on its port, it passes a health check and takes requests again.
    fleet["workers"][1] = start_server(*WORKER, "--port", str(fleet["ports"][1]))[0]
    _wait(lambda: _info(http)["workers"][1]["healthy"], 30, "re-admission")
    routed = _info(http)["workers"][1]["requests_routed"]
    for i in range(2):
        assert http.post("/generate", json=_gen_body(f"fresh topic {i}", 4)).status_code == 200
    assert _info(http)["workers"][1]["requests_routed"] > routed


def test_no_healthy_worker_is_503_at_once(fleet):
    for w in fleet["workers"]:
        stop_server(w)
    http = fleet["http"]
    start = time.monotonic()
    r = http.post("/v1/completions", json={"model": "smollm2-135m", "prompt": "Hi"})
    assert time.monotonic() - start < 5
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_healthy_worker"
    assert r.json()["error"]["type"] == "server_error"
    assert http.get("/health").status_code == 503
