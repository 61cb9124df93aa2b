"""Prefill/decode disaggregation on loopback: one prefill worker, one decode worker and
`radixlm router --prefill-urls --decode-urls` in front (docs/scale-out.md).

Greedy and seeded outputs through the router equal the colocated path (the prefill
worker serves a request without bootstrap fields from end to end with the same code as
`radixlm serve`); the decode worker caches the transferred prompt so the next turn hits
there; a failed or timed-out transfer fails its request with an error and leaves no KV
held on either side; KV of another model or layout is refused with a clear error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from radixlm.lang.backend.runtime import ready_url
from radixlm.runtime.disagg.transport import (
    GlooReceiver,
    GlooSender,
    KVLayout,
    TransferError,
    TransferMeta,
)

from .conftest import start_server, stop_server

TIMEOUT = "4"  # --disaggregation-timeout (s): failures below surface within it
PROMPT = "The three primary colors are"


def _router(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "radixlm", "router", "--port", "0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def pd():
    decode, d_url = start_server(
        "--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", "0",
        "--disaggregation-timeout", TIMEOUT,
    )  # fmt: skip
    prefill, p_url = start_server(
        "--disaggregation-mode", "prefill", "--disaggregation-timeout", TIMEOUT
    )
    router = _router("--prefill-urls", p_url, "--decode-urls", d_url, "--health-interval", "1")
    try:
        base = ready_url(router, 60)
        port = httpx.get(d_url + "/get_server_info").json()["disaggregation"]["bootstrap_port"]
        with httpx.Client(base_url=base, timeout=120) as client:
            yield {
                "router": client,
                "prefill": p_url,
                "decode": d_url,
                "port": port,
                "decode_proc": decode,
            }
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(30)
        stop_server(prefill)
        stop_server(decode)


def _generate(url: str, **extra) -> httpx.Response:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    return httpx.post(url + "/generate", json={**body, **extra}, timeout=120)


def _held(url: str) -> tuple[int, int]:
    """(KV tokens held by requests, requests running or waiting) on a worker."""
    info = httpx.get(url + "/get_server_info").json()
    return info["memory"]["held"], info["num_running"] + info["num_waiting"]


def test_router_greedy_equals_colocated_and_next_turn_hits_decode_cache(pd):
    ref = _generate(pd["prefill"]).json()  # no bootstrap fields: served colocated
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    got = pd["router"].post("/generate", json=body).json()
    assert got["output_ids"] == ref["output_ids"] and got["text"] == ref["text"]
    assert got["meta_info"]["completion_tokens"] == 16

    chunks = []
    with pd["router"].stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    assert chunks[-1]["output_ids"] == ref["output_ids"]  # cumulative, as SGLang streams
    assert chunks[-1]["text"] == ref["text"]

    # The next turn of the conversation: the decode worker holds the earlier turn.
    turn2 = {**body, "text": PROMPT + ref["text"] + " Name one."}
    ref2 = _generate(pd["prefill"], text=turn2["text"]).json()
    got2 = pd["router"].post("/generate", json=turn2).json()
    assert got2["output_ids"] == ref2["output_ids"]
    prompt1 = len(httpx.post(pd["decode"] + "/tokenize", json={"prompt": PROMPT}).json()["tokens"])
    assert got2["meta_info"]["cached_tokens"] >= prompt1 + 15

    info = httpx.get(pd["decode"] + "/get_server_info").json()["disaggregation"]
    assert info["transfers"] == 3 and info["bytes_received"] > 0


def test_router_seeded_sampling_equals_colocated(pd):
    params = {"max_new_tokens": 12, "temperature": 0.9, "seed": 1234}
    body = {"text": "Once upon a time", "sampling_params": params}
    ref = httpx.post(pd["prefill"] + "/generate", json=body, timeout=120).json()
    got = pd["router"].post("/generate", json=body).json()
    assert got["output_ids"] == ref["output_ids"]


def test_decode_refuses_kv_of_another_layout(pd):
    info = httpx.get(pd["decode"] + "/get_server_info").json()["disaggregation"]
    theirs = KVLayout(**{**info["layout"], "model_path": "other-model", "num_kv_heads": 4})
    ids = httpx.post(pd["decode"] + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    kv = torch.zeros(2 * theirs.num_layers, len(ids), 4, theirs.head_dim)
    meta = TransferMeta(
        room=77, layout=theirs, input_ids=ids, first_token=1, seed=0, kv_shape=list(kv.shape)
    )
    result = {}
    waiter = threading.Thread(
        target=lambda: result.update(resp=_generate(pd["decode"], bootstrap_room=77))
    )
    waiter.start()
    time.sleep(0.5)
    with pytest.raises(TransferError, match="refused the KV: KV for a different model"):
        GlooSender("127.0.0.1", pd["port"], 10.0).send(meta, kv)
    waiter.join(30)
    resp = result["resp"]
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert "model_path: sent 'other-model', expected 'smollm2-135m'" in message
    assert "num_kv_heads: sent 4, expected 3" in message
    assert _held(pd["decode"]) == (0, 0)


def test_decode_request_without_kv_times_out_and_holds_nothing(pd):
    start = time.monotonic()
    resp = _generate(pd["decode"], bootstrap_room=12345)
    assert resp.status_code == 503
    assert "no KV arrived for bootstrap_room 12345 within 4 s" in resp.json()["error"]["message"]
    assert time.monotonic() - start < 15
    assert _held(pd["decode"]) == (0, 0)


def test_prefill_transfer_failure_fails_the_request_and_frees_its_kv(pd):
    # A decode side that accepts the link and never acknowledges (blocked).
    blocked = GlooReceiver("127.0.0.1", 0, 30.0)
    blocked.start(lambda meta, raw: time.sleep(60))
    start = time.monotonic()
    resp = _generate(
        pd["prefill"], bootstrap_room=5, bootstrap_host="127.0.0.1", bootstrap_port=blocked.port
    )
    assert resp.status_code == 503
    assert f"KV transfer to 127.0.0.1:{blocked.port} failed" in resp.json()["error"]["message"]
    assert time.monotonic() - start < 30
    assert _held(pd["prefill"]) == (0, 0)
    # The prefill worker still serves and transfers to the real decode worker.
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    assert pd["router"].post("/generate", json=body).status_code == 200


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for k in kids for p in _tree(int(k)))]


def test_blocked_decode_worker_fails_the_request_through_the_router(pd):
    pids = _tree(pd["decode_proc"].pid)
    body = {"text": PROMPT + " Blocked.", "sampling_params": {"max_new_tokens": 8}}
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        resp = pd["router"].post("/generate", json=body)
        elapsed = time.monotonic() - start
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert resp.status_code == 503
    assert "KV transfer to 127.0.0.1:" in resp.json()["error"]["message"]
    assert elapsed < 30
    assert _held(pd["prefill"]) == (0, 0)
    deadline = time.monotonic() + 30  # the forwarded abort (or the KV timeout) lands
    while _held(pd["decode"]) != (0, 0):
        assert time.monotonic() < deadline, _held(pd["decode"])
        time.sleep(0.5)
    while pd["router"].get("/health").status_code != 200:  # re-admitted after its stop
        assert time.monotonic() < deadline
        time.sleep(0.5)
    ok = pd["router"].post("/generate", json={**body, "sampling_params": {"max_new_tokens": 4}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 4


def test_bad_bootstrap_fields_are_refused(pd):
    resp = _generate(pd["prefill"], bootstrap_room=1)  # no decode address
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "bootstrap_host"
    resp = _generate(pd["decode"], bootstrap_room=2, return_logprob=True)
    assert resp.status_code == 400
    assert "no logprobs" in resp.json()["error"]["message"]
    resp = pd["router"].post("/v1/completions", json={"prompt": "hi"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unsupported_route"


def test_router_tokenizes_on_a_decode_worker(pd):
    via = pd["router"].post("/tokenize", json={"prompt": "The capital of France is"})
    direct = httpx.post(pd["decode"] + "/tokenize", json={"prompt": "The capital of France is"})
    assert via.status_code == 200 and via.json() == direct.json()


def test_router_refuses_workers_in_the_wrong_mode(pd):
    router = _router("--prefill-urls", pd["decode"], "--decode-urls", pd["decode"])
    _, err = router.communicate(timeout=60)
    assert router.returncode == 1
    assert f"{pd['decode']} is not a prefill worker" in err
