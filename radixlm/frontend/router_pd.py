"""`radixlm router --prefill-urls ... --decode-urls ...`: prefill/decode disaggregation.

Each POST /generate goes to one prefill worker and one decode worker (each chosen by the
router's policy within its own pool): the decode worker gets the request with a fresh
``bootstrap_room``; the prefill worker gets it with the same room, the decode worker's
``bootstrap_host`` (its URL's host) and ``bootstrap_port`` (read from its
/get_server_info at start) and ``stream: false``. The prefill worker computes the
prompt's KV and sends it to the decode worker (runtime/disagg/), whose answer, streamed
or not, is the client's.

Failures: when the prefill answer is an error before the decode worker has answered
(refused, transfer failed or timed out), the router aborts the decode request and
answers with the prefill worker's error; a decode error is relayed as it is. Only
/generate is served in this mode (the OpenAI routes answer 400 ``unsupported_route``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any
from urllib.parse import urlparse

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixlm.frontend.errors import APIError, json_error
from radixlm.frontend.router_app import (
    Proxy,
    _assign_rid,
    _is_stream,
    add_model_routes,
    no_worker_error,
    worker_failed,
)
from radixlm.frontend.router_pool import WorkerPool, WorkerRefused
from radixlm.frontend.streaming import CLIENT_CLOSED, ClientGone, until_disconnect

logger = logging.getLogger(__name__)

_OPENAI = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


async def check_roles(prefill: WorkerPool, decode: WorkerPool) -> list[int]:
    """The decode workers' bootstrap ports, after checking that every worker runs in its
    pool's --disaggregation-mode. Raises WorkerRefused naming a worker that does not."""
    ports = []
    for pool, mode in ((prefill, "prefill"), (decode, "decode")):
        for w in pool.workers:
            resp = await pool.client.get(f"{w.url}/get_server_info", timeout=10.0)
            info = resp.json().get("disaggregation") if resp.status_code == 200 else None
            if not isinstance(info, dict) or info.get("mode") != mode:
                raise WorkerRefused(
                    f"{w.url} is not a {mode} worker: start it with "
                    f"`radixlm serve --disaggregation-mode {mode}`"
                )
            if mode == "decode":
                ports.append(int(info["bootstrap_port"]))
    return ports


class PDProxy:
    """Sends each /generate to a prefill and a decode worker (module docstring)."""

    def __init__(self, prefill: WorkerPool, decode: WorkerPool, bootstrap_ports: list[int]):
        self.prefill, self.decode = prefill, decode
        self.client = decode.client
        self.ports = bootstrap_ports
        self.relay = Proxy(decode)  # streaming relay and abort forwarding on the decode side
        self.prefill_relay = Proxy(prefill)  # abort forwarding on the prefill side
        self.prefill_failures = 0

    async def forward(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return json_error(APIError(400, "the body must be a JSON object", param="body"))
        rid = _assign_rid(body)
        if rid is None:
            return json_error(
                APIError(400, "prefill/decode routing takes one prompt with n = 1", param="text")
            )
        d = self.decode.choose(body)
        if d is None:
            return json_error(no_worker_error())
        p = self.prefill.choose(body)
        if p is None:
            self.decode.release(d)
            return json_error(no_worker_error())
        room = random.getrandbits(63)
        d_url, p_url = self.decode.workers[d].url, self.prefill.workers[p].url
        bootstrap = {
            "bootstrap_host": urlparse(d_url).hostname,
            "bootstrap_port": self.ports[d],
            "bootstrap_room": room,
        }
        p_body = {**body, **bootstrap, "stream": False}
        d_req = self.client.build_request(
            "POST", d_url + "/generate", json={**body, "bootstrap_room": room}
        )
        prefill = asyncio.create_task(self.client.post(p_url + "/generate", json=p_body))
        prefill.add_done_callback(lambda task: self._prefill_done(task, p))
        decoded = asyncio.create_task(self.client.send(d_req, stream=_is_stream(body)))
        try:
            failed = await until_disconnect(request, self._prefill_failure(p_url, prefill, decoded))
        except ClientGone:
            self._abort_both(d, p, rid, decoded)
            return Response(status_code=CLIENT_CLOSED)
        if failed is not None:
            self.prefill_failures += 1
            self._abort_both(d, None, rid, decoded)
            return failed
        try:
            resp = await decoded
        except httpx.HTTPError as e:
            self.decode.release(d)
            self.decode.mark_failed(d, e)
            return json_error(worker_failed(d_url, e))
        if _is_stream(body) and resp.status_code == 200:
            return self.relay._relay(request, resp, d, rid)
        content = await resp.aread()
        await resp.aclose()
        self.decode.release(d)
        media = resp.headers.get("content-type")
        return Response(content, status_code=resp.status_code, media_type=media)

    def _prefill_done(self, task: asyncio.Task, rank: int) -> None:
        """Release prefill worker `rank`; log a failure nobody waits for any more."""
        self.prefill.release(rank)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("prefill worker request failed: %r", task.exception())

    async def _prefill_failure(self, url: str, prefill: asyncio.Task, decoded: asyncio.Task):
        """The prefill worker's error response if it failed before the decode worker
        answered, else None (the decode answer is then awaited by the caller)."""
        await asyncio.wait({prefill, decoded}, return_when=asyncio.FIRST_COMPLETED)
        if not prefill.done():
            return None
        try:
            resp = prefill.result()
        except httpx.HTTPError as e:
            return json_error(worker_failed(url, e))
        if resp.status_code == 200:
            return None
        media = resp.headers.get("content-type")
        return Response(resp.content, status_code=resp.status_code, media_type=media)

    def _abort_both(self, d: int, p: int | None, rid: str, decoded: asyncio.Task) -> None:
        """Abort `rid` on decode worker `d` (and prefill worker `p`), close its answer."""

        async def close() -> None:
            try:
                resp = await decoded
                await resp.aclose()
            except httpx.HTTPError:
                pass
            finally:
                self.decode.release(d)

        self.relay._abort_later(d, rid, None)
        if p is not None:
            self.prefill_relay._abort_later(p, rid, None)
        task = asyncio.get_running_loop().create_task(close())
        self.relay._background.add(task)
        task.add_done_callback(self.relay._background.discard)


def create_pd_router_app(
    prefill: WorkerPool, decode: WorkerPool, bootstrap_ports: list[int]
) -> FastAPI:
    """The router app in prefill/decode mode (both pools admitted, roles checked)."""
    app = FastAPI(title="radixlm router (prefill/decode)", docs_url=None, redoc_url=None)
    proxy = app.state.proxy = PDProxy(prefill, decode, bootstrap_ports)
    pools = (prefill, decode)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        return await proxy.forward(request)

    async def unsupported(request: Request) -> Response:
        return json_error(
            APIError(
                400,
                f"{request.url.path} is not routed in prefill/decode mode; use /generate",
                code="unsupported_route",
            )
        )

    for path in _OPENAI:
        app.add_api_route(path, unsupported, methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        if not all(pool.healthy_ranks() for pool in pools):
            return json_error(no_worker_error())
        return Response(status_code=200)

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return {
            "mode": "prefill_decode",
            "policy": decode.policy.name,
            "prefill_workers": [w.report() for w in prefill.workers],
            "decode_workers": [
                {**w.report(), "bootstrap_port": port}
                for w, port in zip(decode.workers, bootstrap_ports)
            ],
            "prefill_failures": proxy.prefill_failures,
            "aborts_forwarded": proxy.relay.aborts_forwarded,
        }

    add_model_routes(app, decode)

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        answers = [
            a for pool in pools for a in await Proxy(pool).broadcast("/flush_cache", b"", {})
        ]
        if not answers:
            return json_error(no_worker_error())
        refused = [r for r in answers if r.status_code != 200]
        if refused:
            media = "application/json"
            return Response(refused[0].content, refused[0].status_code, media_type=media)
        return JSONResponse({"flushed": len(answers)})

    return app
