"""The workers behind `radixlm router`: admission at start, periodic health checks,
removal and re-admission, in-flight counts, and the routing key of a request.

A worker is a `radixlm serve` process (or an SGLang-compatible server) reached over HTTP.
At start every URL must answer ``GET /get_model_info`` with SGLang's fields
(``model_path``, ``is_generation``) and the same ``served_model_name`` (when it gives one)
as the others; an unreachable URL is retried until `startup_timeout` passes. Anything else
refuses the start with a `WorkerRefused` naming the URL and what it answered.

While serving, ``GET /health`` is probed every `health_interval` seconds: a failed probe
(no answer within `health_timeout`, or a status other than 200) removes the worker from
routing; a later passing probe re-admits it, with its approximate cache tree emptied (a
restarted worker's cache is empty). A request that cannot connect to a worker also
removes it at once (`mark_failed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from radixlm.runtime.server.dispatcher import DispatchPolicy

logger = logging.getLogger(__name__)

#: Characters of a request's text (or token ids) its routing key keeps.
KEY_LIMIT = 4096


class WorkerRefused(RuntimeError):
    """A worker URL given at start is not a usable radixlm worker (message says why)."""


@dataclass
class Worker:
    """One worker: its base URL (no trailing slash), whether it takes requests, requests
    in flight on it and routed to it since start, and its model name."""

    url: str
    healthy: bool = True
    in_flight: int = 0
    routed: int = 0
    model: str | None = None

    def report(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "requests_routed": self.routed,
        }


class WorkerPool:
    """The workers, by rank (their order on the command line), and the dispatch policy.

    Attributes: workers, policy, client (the shared httpx.AsyncClient).
    """

    def __init__(
        self,
        urls: Sequence[str],
        policy: DispatchPolicy,
        client: httpx.AsyncClient,
        *,
        health_interval: float = 2.0,
        health_timeout: float = 2.0,
    ):
        if not urls:
            raise WorkerRefused("give at least one worker URL (--worker-urls)")
        self.workers = [Worker(u.rstrip("/")) for u in urls]
        self.policy = policy
        self.client = client
        self.health_interval = health_interval
        self.health_timeout = health_timeout

    # ---- admission -------------------------------------------------------------------------

    async def admit_all(self, startup_timeout: float) -> None:
        """Check every worker (see the module docstring). Raises WorkerRefused."""
        deadline = time.monotonic() + startup_timeout
        for w in self.workers:
            w.model = await self._identify(w.url, deadline)
        names = {w.model for w in self.workers if w.model is not None}
        if len(names) > 1:
            served = ", ".join(f"{w.url}: {w.model}" for w in self.workers)
            raise WorkerRefused(f"the workers serve different models ({served})")

    async def _identify(self, url: str, deadline: float) -> str | None:
        """The served model name of the radixlm worker at `url`. Raises WorkerRefused."""
        while True:
            try:
                resp = await self.client.get(f"{url}/get_model_info", timeout=10.0)
                break
            except httpx.TransportError as e:
                if time.monotonic() >= deadline:
                    raise WorkerRefused(f"worker {url} did not answer: {e!r}") from None
                await asyncio.sleep(0.5)
        what = f"GET {url}/get_model_info answered {resp.status_code}"
        try:
            info = resp.json() if resp.status_code == 200 else None
        except ValueError:
            info = None
        if not isinstance(info, dict) or not {"model_path", "is_generation"} <= info.keys():
            raise WorkerRefused(
                f"{url} is not a radixlm worker: {what} without SGLang's model info "
                f"(model_path, is_generation); start it with `radixlm serve`"
            )
        return info.get("served_model_name")

    # ---- health ------------------------------------------------------------------------------

    async def health_loop(self) -> None:
        """Probe every worker each `health_interval` seconds, forever (cancel to stop)."""
        while True:
            await asyncio.gather(*(self.probe(r) for r in range(len(self.workers))))
            await asyncio.sleep(self.health_interval)

    async def probe(self, rank: int) -> bool:
        """One health probe of worker `rank`; updates and returns its health."""
        w = self.workers[rank]
        try:
            resp = await self.client.get(f"{w.url}/health", timeout=self.health_timeout)
            ok = resp.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok and not w.healthy:
            self.policy.forget_rank(rank)
            logger.info("worker %s is healthy again: re-admitted", w.url)
        elif not ok and w.healthy:
            logger.warning("worker %s failed its health check: removed", w.url)
        w.healthy = ok
        return ok

    def mark_failed(self, rank: int, error: Exception) -> None:
        """Remove worker `rank` from routing after a connection failure."""
        w = self.workers[rank]
        if w.healthy:
            logger.warning("worker %s unreachable (%r): removed", w.url, error)
        w.healthy = False

    # ---- routing ------------------------------------------------------------------------------

    def healthy_ranks(self, exclude: Sequence[int] = ()) -> list[int]:
        return [r for r, w in enumerate(self.workers) if w.healthy and r not in exclude]

    def choose(self, body: Any, exclude: Sequence[int] = ()) -> int | None:
        """The rank of the healthy worker (not in `exclude`) to send `body` (a parsed JSON
        request) to, counted in flight until `release`; None when there is none."""
        candidates = self.healthy_ranks(exclude)
        if not candidates:
            return None
        loads = [w.in_flight for w in self.workers]
        namespace = body.get("cache_salt") if isinstance(body, dict) else None
        rank = self.policy.choose(request_key(body), candidates, loads, namespace)
        self.workers[rank].in_flight += 1
        self.workers[rank].routed += 1
        return rank

    def release(self, rank: int) -> None:
        self.workers[rank].in_flight -= 1


def request_key(body: Any) -> list[int]:
    """The routing key of a request body: its token ids (``input_ids``), else its text as
    Unicode code points (``text`` / ``prompt``, the first one of a list; chat
    ``messages`` as role and text per message; a Responses ``input``), at most KEY_LIMIT
    long. Requests that share a prompt prefix share a key prefix."""
    if not isinstance(body, dict):
        return []
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], int):
        return [i for i in ids[:KEY_LIMIT] if isinstance(i, int)]
    text = body.get("text", body.get("prompt", body.get("input")))
    if isinstance(text, list):
        text = text[0] if text and isinstance(text[0], str) else None
    if not isinstance(text, str):
        messages = body.get("messages", body.get("input"))
        text = _messages_text(messages) if isinstance(messages, list) else ""
    return [ord(c) for c in text[:KEY_LIMIT]]


def _messages_text(messages: list) -> str:
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{m.get('role', '')}\n{content if isinstance(content, str) else ''}\n")
    return "".join(parts)
