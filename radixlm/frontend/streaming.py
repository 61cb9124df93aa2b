"""Server-sent events, merged request streams, and client-disconnect handling.

Invariant: every `TokenizerManager.generate` iterator a route opens is closed when the
route is done with it, whether the request finished, failed, or the client went away;
closing an unfinished iterator aborts the request in the scheduler (its KV slots return
to the pool at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import msgspec
from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"
CLIENT_CLOSED = 499  # nginx's "client closed request": the status of a response nobody reads


def sse(data: Any) -> bytes:
    """One server-sent event carrying `data` as JSON."""
    return b"data: " + _encoder.encode(data) + b"\n\n"


class ClientGone(Exception):
    """The client closed the connection before the response started."""


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, aw: Awaitable[T]) -> T:
    """Await `aw`, cancelling it if the client disconnects first.

    Raises ClientGone when the client went away (after `aw` is cancelled), else whatever
    `aw` raises. Call only after the request body is read.
    """
    work = asyncio.ensure_future(aw)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, watch):
            task.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
    if work.cancelled():
        raise ClientGone
    return work.result()


async def merge(streams: list[AsyncIterator[dict]]) -> AsyncIterator[tuple[int, dict]]:
    """Yield ``(index, chunk)`` from several request streams as chunks arrive.

    The first error of any stream is raised after the others are closed. Closing this
    iterator closes (aborts) every stream still running.
    """
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for chunk in only:
                yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, dict | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[dict]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    queue.put_nowait((index, chunk, None))
        except Exception as e:  # noqa: BLE001 - re-raised by the consumer
            queue.put_nowait((index, None, e))
        else:
            queue.put_nowait((index, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, chunk, error = await queue.get()
            if error is not None:
                raise error
            if chunk is None:
                running -= 1
            else:
                yield index, chunk
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_chunk(
    request: Request, merged: AsyncIterator[tuple[int, dict]]
) -> tuple[int, dict] | None:
    """The first ``(index, chunk)`` of a stream, awaited before the response starts so
    request errors (validation, queue full) still get their HTTP status.

    Raises ClientGone (after closing `merged`) when the client leaves first, or the
    stream's error (also after closing it).
    """
    try:
        return await until_disconnect(request, anext(merged, None))
    except BaseException:
        await merged.aclose()
        raise


async def collect(merged: AsyncIterator[tuple[int, dict]], n: int) -> list[dict[str, Any]]:
    """Run `n` merged streams to the end (closing them on any exit).

    Returns one dict per index: text, output_ids, finish_reason, matched_stop, usage,
    output_logprobs (the chunks' `TokenLogprobs` joined, or None), input_logprobs,
    abort_requested (stopped through POST /abort_request).
    """
    results: list[dict[str, Any]] = [new_result() for _ in range(n)]
    async with contextlib.aclosing(merged):
        async for index, chunk in merged:
            r = results[index]
            r["text"] += chunk["text"]
            r["output_ids"].extend(chunk["output_ids"])
            add_logprobs(r, chunk)
            if chunk["finish_reason"] is not None:
                r["finish_reason"] = chunk["finish_reason"]
                r["matched_stop"] = chunk.get("matched_stop")
                r["usage"] = chunk.get("usage")
                r["abort_requested"] = chunk.get("abort_requested", False)
    return results


def new_result() -> dict[str, Any]:
    """An empty accumulated result (see `collect`)."""
    return {
        "text": "",
        "output_ids": [],
        "finish_reason": None,
        "matched_stop": None,
        "usage": None,
        "output_logprobs": None,
        "input_logprobs": None,
        "abort_requested": False,
    }


def add_logprobs(result: dict[str, Any], chunk: dict[str, Any]) -> None:
    """Join a chunk's logprobs (`TokenLogprobs`) into an accumulated result."""
    if chunk.get("input_logprobs") is not None:
        result["input_logprobs"] = chunk["input_logprobs"]
    lp = chunk.get("output_logprobs")
    if lp is not None:
        if result["output_logprobs"] is None:
            result["output_logprobs"] = msgspec.structs.replace(
                lp,
                logprobs=list(lp.logprobs),
                token_ids=list(lp.token_ids),
                top_logprobs=None if lp.top_logprobs is None else list(lp.top_logprobs),
                top_ids=None if lp.top_ids is None else list(lp.top_ids),
                asked_logprobs=None if lp.asked_logprobs is None else list(lp.asked_logprobs),
            )
        else:
            result["output_logprobs"].extend(lp)


class SSEResponse(StreamingResponse):
    """A text/event-stream response that always closes its body iterator.

    Starlette cancels the send loop when the client disconnects but leaves the body
    generator suspended; closing it here runs its cleanup (request abort) right away.
    """

    def __init__(self, body: AsyncIterator[bytes]):
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
