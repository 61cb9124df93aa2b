"""Concurrent streams sharing a prefix, client disconnects, and cache flushes on the real
server; KV accounting is read back through /get_server_info."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from .conftest import API_KEY, MODEL, chat_ids, sse_payloads, wait_idle

SYSTEM = (
    "You are the dispatcher of a small shipping company. You answer questions about "
    "parcels, delivery windows, customs forms and warehouse hours. Keep every answer short, "
    "polite and factual, and never invent tracking numbers. "
) * 3
LONG = {"max_tokens": 4000, "ignore_eos": True, "temperature": 0, "stream": True}


def _check_accounting(info: dict) -> None:
    mem = info["memory"]
    parts = ("free", "evictable", "protected", "pinned", "held")
    assert sum(mem[k] for k in parts) == mem["total"]


def test_16_concurrent_streams_share_the_system_prompt(server, tokenizer):
    import openai

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0)

        async def one(i: int, started: asyncio.Event | None = None):
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Where is parcel number {i}?"},
                ],
                max_tokens=5,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, reason, usage = "", None, None
            async for chunk in stream:
                if started is not None:
                    started.set()
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    reason = chunk.choices[0].finish_reason or reason
                if chunk.usage is not None:
                    usage = chunk.usage
            return text, reason, usage

        # The first stream's prompt is in the radix cache once its first chunk arrives;
        # the other 15 start while it still runs.
        started = asyncio.Event()
        first = asyncio.create_task(one(0, started))
        await started.wait()
        results = await asyncio.gather(first, *(one(i) for i in range(1, 16)))
        await client.close()
        return results

    results = asyncio.run(main())
    assert len(results) == 16
    system_len = len(chat_ids(tokenizer, [{"role": "system", "content": SYSTEM}]))
    for i, (text, reason, usage) in enumerate(results):
        assert reason in ("stop", "length") and usage.completion_tokens >= 1
        assert text or reason == "stop"
        assert usage.prompt_tokens > system_len
        if i > 0:
            assert usage.prompt_tokens_details.cached_tokens >= system_len - 2, i


def test_disconnect_mid_stream_aborts_and_frees_kv(http):
    wait_idle(http)
    body = {"prompt": "Write a very long story about a lighthouse.", **LONG}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        payloads = sse_payloads(next(lines) for _ in range(6))
        assert payloads and json.loads(payloads[0])["choices"][0]["finish_reason"] is None
        busy = http.get("/get_server_info").json()
        assert busy["num_running"] == 1 and busy["memory"]["held"] > 0
    # Leaving the block closes the connection mid-stream (4000 tokens would take minutes).
    _check_accounting(wait_idle(http, timeout=30))


def test_disconnect_chat_and_native_streams(http):
    chat = {"messages": [{"role": "user", "content": "Count to a thousand."}], **LONG}
    native = {
        "text": "Count to a thousand:",
        "stream": True,
        "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 0},
    }
    for path, body in (("/v1/chat/completions", chat), ("/generate", native)):
        with http.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            next(r.iter_lines())
        _check_accounting(wait_idle(http, timeout=30))


def test_disconnect_before_response_aborts(http):
    """A non-streamed request whose client gives up is aborted too."""
    body = {"prompt": "Write a very long story.", **LONG, "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=body, timeout=2.0)
    _check_accounting(wait_idle(http, timeout=30))


def test_flush_cache_refused_while_running(http):
    wait_idle(http)
    body = {"prompt": "Tell me about the sea.", **LONG}
    with http.stream("POST", "/v1/completions", json=body) as r:
        it = r.iter_lines()
        first = next(it)
        info = http.get("/get_server_info").json()
        assert info["num_running"] == 1, (first, info)
        refused = http.post("/flush_cache")
        assert refused.status_code == 409
        assert "running" in refused.json()["error"]["message"]
    wait_idle(http, timeout=30)
    assert http.post("/flush_cache").status_code == 200
    info = http.get("/get_server_info").json()
    assert info["memory"]["evictable"] == 0 and info["memory"]["held"] == 0
    _check_accounting(info)


def test_slow_request_preparation_leaves_the_event_loop_free(server):
    """Compiling a large json_schema (seconds) runs off the event loop: /health answers
    quickly throughout, where it would wait for the whole compile on the loop. (The
    scheduler compiles its own matcher too, which takes the rest of the request's time.)"""
    import time
    import uuid

    tag = uuid.uuid4().hex  # a schema the server's grammar cache has not seen
    enum = [f"value number {i} {tag}" for i in range(3000)]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Pick one."}],
        "max_tokens": 1,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "pick", "schema": {"type": "string", "enum": enum}},
        },
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def main():
        async with httpx.AsyncClient(base_url=server, headers=headers, timeout=300) as c:
            t0 = time.perf_counter()
            slow = asyncio.create_task(c.post("/v1/chat/completions", json=body))
            waits = []
            while not slow.done():
                t = time.perf_counter()
                assert (await c.get("/health")).status_code == 200
                waits.append(time.perf_counter() - t)
            return (await slow), time.perf_counter() - t0, waits

    resp, total, waits = asyncio.run(main())
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == '"'  # the schema's 1st token
    assert total > 0.5  # the compile is slow enough to tell a blocked loop
    # measured: on the loop, one /health waited 5.0 s of 12.1; off it, 0.19 s of 14.2
    assert len(waits) >= 3 and max(waits) < total / 8
