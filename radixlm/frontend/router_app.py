"""`radixlm router`: one HTTP endpoint in front of several `radixlm serve` workers.

Routes:
    POST /generate, /v1/completions, /v1/chat/completions, /v1/responses
                             proxied to one healthy worker chosen by the policy
                             (`runtime/server/dispatcher.py` over `router_pool.request_key`)
    GET  /health             200 while a worker is healthy, else 503
    GET  /get_server_info    the policy and each worker's url, health, in-flight and routed
    GET  /v1/models, /get_model_info, POST /tokenize, /detokenize
                             a healthy worker's answer
    POST /flush_cache        every healthy worker's cache (and the policy's trees)
    POST /abort_request      sent to every healthy worker; 200 when one aborted something

Request handling:
* Retry: a request that could not connect to its worker (connection refused or timed
  out: the worker never saw it) goes to another healthy worker, and the failed worker is
  removed from routing (`WorkerPool.mark_failed`). With no healthy worker left the answer
  is 503 ``no_healthy_worker`` at once, an OpenAI error body.
* A worker that fails after it got the request (it died mid-generation) is not retried
  (the request may have run): a non-streamed request gets 502 ``worker_failed``; a stream
  gets an SSE event ``{"error": {...}}`` and ``data: [DONE]``. No request ends silently.
* Streams (``text/event-stream``) are relayed chunk by chunk as the worker sends them.
* Client disconnect: the router closes its connection to the worker (a radixlm worker
  aborts a request whose client went away) and posts ``/abort_request`` with the
  request's id: for /generate the router gives a request without ``rid`` one
  (``router-<hex>``); for an OpenAI stream the id is read from its first chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.responses import StreamingResponse

from radixlm.frontend.errors import APIError, json_error
from radixlm.frontend.router_pool import WorkerPool
from radixlm.frontend.streaming import CLIENT_CLOSED, DONE, ClientGone, sse, until_disconnect

logger = logging.getLogger(__name__)

_PROXIED = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses")
_FORWARDED_HEADERS = ("authorization", "content-type", "accept")


def no_worker_error() -> APIError:
    return APIError(
        503,
        "no healthy worker is available; retry when one passes its health check",
        type="server_error",
        code="no_healthy_worker",
    )


def worker_failed(url: str, error: Exception) -> APIError:
    return APIError(
        502,
        f"worker {url} failed while serving the request: {error!r}",
        type="server_error",
        code="worker_failed",
    )


class Proxy:
    """Sends requests to the pool's workers (module docstring for the rules)."""

    def __init__(self, pool: WorkerPool):
        self.pool = pool
        self.client = pool.client
        self.aborts_forwarded = 0
        self._background: set[asyncio.Task] = set()

    async def forward(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        rid = _assign_rid(body) if path == "/generate" else None
        if rid is not None:
            raw = json.dumps(body).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}
        tried: list[int] = []
        while True:
            rank = self.pool.choose(body, exclude=tried)
            if rank is None:
                return json_error(no_worker_error())
            url = self.pool.workers[rank].url
            upstream = self.client.build_request("POST", url + path, content=raw, headers=headers)
            try:
                if _is_stream(body):
                    resp = await self.client.send(upstream, stream=True)
                    return self._relay(request, resp, rank, rid)
                return await until_disconnect(request, self._whole(upstream, rank))
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                self.pool.release(rank)
                self.pool.mark_failed(rank, e)
                tried.append(rank)
            except httpx.HTTPError as e:
                self.pool.release(rank)
                return json_error(worker_failed(url, e))
            except ClientGone:
                self._abort_later(rank, rid, None)
                self.pool.release(rank)
                return Response(status_code=CLIENT_CLOSED)

    async def _whole(self, upstream: httpx.Request, rank: int) -> Response:
        """A non-streamed request: the worker's whole answer, relayed as is."""
        resp = await self.client.send(upstream)
        self.pool.release(rank)
        media = resp.headers.get("content-type")
        return Response(resp.content, status_code=resp.status_code, media_type=media)

    def _relay(self, request: Request, resp: httpx.Response, rank: int, rid: str | None):
        url = self.pool.workers[rank].url

        async def chunks():
            seen_id = rid
            done = False
            try:
                async for chunk in resp.aiter_raw():
                    if seen_id is None:
                        seen_id = _sse_id(chunk)
                    yield chunk
                done = True
            except httpx.HTTPError as e:
                done = True
                logger.warning("worker %s failed mid-stream: %r", url, e)
                yield sse({"error": worker_failed(url, e).body()["error"]})
                yield DONE
            finally:
                self.pool.release(rank)
                if not done:  # the client went away: stop the request on the worker
                    self._abort_later(rank, seen_id, resp)
                else:
                    await resp.aclose()

        media = resp.headers.get("content-type", "text/event-stream")
        return StreamingResponse(chunks(), status_code=resp.status_code, media_type=media)

    def _abort_later(self, rank: int, rid: str | None, resp: httpx.Response | None) -> None:
        """Post /abort_request for `rid` to worker `rank`, then close `resp`, in a task of
        its own (the caller may be a cancelled stream)."""

        async def run() -> None:
            if rid is not None:
                try:
                    await self.client.post(
                        f"{self.pool.workers[rank].url}/abort_request", json={"rid": rid}
                    )
                    self.aborts_forwarded += 1
                except httpx.HTTPError as e:
                    logger.info("abort of %s not forwarded: %r", rid, e)
            if resp is not None:
                await resp.aclose()

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def broadcast(self, path: str, raw: bytes, headers: dict) -> list[httpx.Response]:
        """POST `raw` to `path` on every healthy worker; the answers of those that answered."""
        ranks = self.pool.healthy_ranks()
        urls = [self.pool.workers[r].url + path for r in ranks]
        results = await asyncio.gather(
            *(self.client.post(u, content=raw, headers=headers) for u in urls),
            return_exceptions=True,
        )
        return [r for r in results if isinstance(r, httpx.Response)]


def add_model_routes(app: FastAPI, pool: WorkerPool) -> None:
    """Routes whose answer depends only on the model, answered by the first healthy worker
    of `pool` (a worker that cannot be reached is marked failed and the next one asked;
    503 no_healthy_worker when none answers): GET /v1/models and /get_model_info, and
    POST /tokenize and /detokenize with the client's body (a worker's 4xx is the answer,
    so a prompt too long gets its 400 as from the worker)."""

    async def from_any(request: Request) -> Response:
        raw = await request.body() if request.method == "POST" else None
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}
        for rank in pool.healthy_ranks():
            url = pool.workers[rank].url + request.url.path
            try:
                resp = await pool.client.request(request.method, url, content=raw, headers=headers)
            except httpx.HTTPError as e:
                pool.mark_failed(rank, e)
                continue
            return Response(resp.content, resp.status_code, media_type="application/json")
        return json_error(no_worker_error())

    app.add_api_route("/v1/models", from_any, methods=["GET"])
    app.add_api_route("/get_model_info", from_any, methods=["GET"])
    app.add_api_route("/tokenize", from_any, methods=["POST"])
    app.add_api_route("/detokenize", from_any, methods=["POST"])


def _is_stream(body: Any) -> bool:
    return isinstance(body, dict) and body.get("stream") is True


def _assign_rid(body: Any) -> str | None:
    """Give a single-prompt /generate body without ``rid`` a router id (for abort
    forwarding); returns the request's rid, or None when it cannot be given one (a batch,
    n > 1, an id of the client's own is returned as is)."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("rid"), str):
        return body["rid"]
    prompt = body.get("text", body.get("input_ids"))
    params = body.get("sampling_params")
    n = params.get("n", 1) if isinstance(params, dict) else 1
    single = isinstance(prompt, str) or (
        isinstance(prompt, list) and all(isinstance(i, int) for i in prompt)
    )
    if body.get("rid") is not None or not single or n not in (1, None):
        return None
    body["rid"] = f"router-{uuid.uuid4().hex}"
    return body["rid"]


def _sse_id(chunk: bytes) -> str | None:
    """The ``id`` of the first SSE event in `chunk` (an OpenAI stream chunk), if any."""
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                value = json.loads(line[6:]).get("id")
            except ValueError:
                return None
            return value if isinstance(value, str) else None
    return None


def create_router_app(pool: WorkerPool) -> FastAPI:
    """The router's FastAPI app over `pool` (admitted; its health loop runs elsewhere)."""
    app = FastAPI(title="radixlm router", docs_url=None, redoc_url=None, openapi_url=None)
    proxy = app.state.proxy = Proxy(pool)

    for path in _PROXIED:

        async def route(request: Request, path: str = path) -> Response:
            return await proxy.forward(request, path)

        app.add_api_route(path, route, methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        if not pool.healthy_ranks():
            return json_error(no_worker_error())
        return Response(status_code=200)

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return {
            "policy": pool.policy.name,
            "workers": [w.report() for w in pool.workers],
            "aborts_forwarded": proxy.aborts_forwarded,
        }

    add_model_routes(app, pool)

    @app.post("/flush_cache")
    async def flush_cache(request: Request) -> Response:
        answers = await proxy.broadcast("/flush_cache", b"", {})
        if not answers:
            return json_error(no_worker_error())
        pool.policy.forget()
        refused = [r for r in answers if r.status_code != 200]
        first = refused[0] if refused else answers[0]
        return Response(first.content, first.status_code, media_type="application/json")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        raw = await request.body()
        headers = {"content-type": "application/json"}
        answers = await proxy.broadcast("/abort_request", raw, headers)
        if not answers:
            return json_error(no_worker_error())
        done = [r for r in answers if r.status_code == 200]
        if done:
            aborted = sorted(i for r in done for i in r.json().get("aborted", []))
            return JSONResponse({"aborted": aborted})
        first = answers[0]
        return Response(first.content, first.status_code, media_type="application/json")

    return app
