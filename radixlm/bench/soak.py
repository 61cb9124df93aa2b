"""Soak driver: a fixed-seed random mix of OpenAI requests against a running server.

The mix (`soak_plan`): chat and text completions, streamed and not, ``n`` of 1 or 2, small
``max_tokens``, and a share of requests the client abandons on purpose -- ``mid_stream``
(a streamed request whose connection is closed after k chunks) and ``timeout`` (a client
deadline shorter than the request: httpx's read timeout for a non-streamed request, which
receives no byte before it finishes; a total ``asyncio.timeout`` for a streamed one,
whose chunks would keep resetting a read timeout). `run_soak` sends the plan with bounded
concurrency and classifies each request:

* ``completed``: HTTP 200 with a well-formed answer: n choices, each finished with
  ``stop`` or ``length`` (``length`` when ``ignore_eos``), and a stream ends with
  ``[DONE]``. A request planned for abort that finishes first also counts here.
* ``aborted``: the planned abort happened (the client closed or gave up).
* ``failed``: anything else -- any non-200 status (the plan sends only valid requests,
  so a 4xx is a defect too), an error event inside a stream, a malformed answer, a
  transport error, or the safety timeout (``request_timeout_s``) of a request that was
  not planned to time out. The reason is kept as one line.

`summarize_soak` gives the counts and end-to-end latency percentiles of completed
requests (milliseconds). `radixlm.bench.server_checks` reads the server's state
afterwards. Used by tests/frontend/test_soak.py and benchmarks/soak.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from radixlm.bench.backends import error_detail, error_message
from radixlm.bench.stats import percentile

_WORDS = (
    "harbor lantern river copper meadow signal orchard winter ladder canvas pebble "
    "thunder garden velvet compass marble shadow forest candle bridge silver anchor"
).split()
_ABORTS = ("mid_stream", "timeout")


@dataclass(frozen=True)
class SoakRequest:
    """One planned request.

    route: "chat" (/v1/chat/completions) or "completion" (/v1/completions).
    abort: None, "mid_stream" (close after `abort_after_chunks` SSE chunks; streamed
        requests only) or "timeout" (client deadline of `timeout_s` seconds).
    temperature: 0 (greedy) or 0.8; n == 2 always samples.
    """

    index: int
    route: str
    stream: bool
    n: int
    max_tokens: int
    ignore_eos: bool
    temperature: float
    text: str
    abort: str | None = None
    abort_after_chunks: int = 0
    timeout_s: float = 0.0

    def body(self, model: str) -> dict[str, Any]:
        """The JSON body of this request for `model`."""
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "stream": self.stream,
            "seed": self.index,
        }
        if self.route == "chat":
            body["messages"] = [{"role": "user", "content": self.text}]
        else:
            body["prompt"] = self.text
        return body

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.route == "chat" else "/v1/completions"


@dataclass
class SoakOutcome:
    """What happened to one request. kind: "completed", "aborted" or "failed".
    latency_s: send -> last byte (completed) or -> the abort/failure. reason: one line
    for a failure, the abort kind for an abort, None when completed."""

    index: int
    kind: str
    latency_s: float
    reason: str | None = None


def soak_plan(
    num_requests: int,
    seed: int = 0,
    abort_rate: float = 0.2,
    max_tokens: tuple[int, int] = (4, 24),
    abort_max_tokens: int = 48,
    prompt_words: tuple[int, int] = (8, 40),
) -> list[SoakRequest]:
    """`num_requests` requests drawn with random.Random(seed); the same arguments always
    give the same plan.

    abort_rate: fraction (0..1) planned for abort, split evenly between mid-stream and
        timeout; a mid-stream abort needs a stream, so it always streams. Abandoned
        requests ask for `abort_max_tokens` with ignore_eos so they are still running
        when the client leaves. max_tokens: inclusive range for the others.
    prompt_words: inclusive range of words per prompt (a word is about 1-2 tokens).
    Raises ValueError for a rate outside [0, 1] or an empty range.
    """
    if not 0.0 <= abort_rate <= 1.0:
        raise ValueError(f"abort_rate must be in [0, 1], got {abort_rate}")
    if not 1 <= max_tokens[0] <= max_tokens[1] or not 1 <= prompt_words[0] <= prompt_words[1]:
        raise ValueError("max_tokens and prompt_words must be ranges (lo, hi), 1 <= lo <= hi")
    rng = random.Random(seed)
    plan = []
    for i in range(num_requests):
        abort = rng.choice(_ABORTS) if rng.random() < abort_rate else None
        n = 2 if rng.random() < 0.3 else 1
        words = rng.randint(*prompt_words)
        plan.append(
            SoakRequest(
                index=i,
                route=rng.choice(("chat", "completion")),
                stream=abort == "mid_stream" or rng.random() < 0.5,
                n=n,
                max_tokens=abort_max_tokens if abort else rng.randint(*max_tokens),
                ignore_eos=abort is not None or rng.random() < 0.7,
                temperature=0.8 if n > 1 or rng.random() < 0.5 else 0.0,
                text=f"Request {i}: " + " ".join(rng.choices(_WORDS, k=words)),
                abort=abort,
                abort_after_chunks=rng.randint(1, 3) if abort == "mid_stream" else 0,
                timeout_s=round(rng.uniform(0.05, 0.5), 3) if abort == "timeout" else 0.0,
            )
        )
    return plan


class _Malformed(Exception):
    """A 200 answer that breaks the API's shape (a failure)."""


def _check_finishes(req: SoakRequest, finishes: dict[int, str | None]) -> None:
    """Every choice index 0..n-1 finished, with "length" under ignore_eos."""
    if sorted(finishes) != list(range(req.n)):
        raise _Malformed(f"choice indexes {sorted(finishes)}, expected 0..{req.n - 1}")
    allowed = ("length",) if req.ignore_eos else ("stop", "length")
    bad = {i: r for i, r in finishes.items() if r not in allowed}
    if bad:
        raise _Malformed(f"finish_reason {bad}, expected one of {allowed}")


async def _plain(client: httpx.AsyncClient, req: SoakRequest, model: str) -> None:
    timeout = httpx.Timeout(req.timeout_s) if req.abort == "timeout" else httpx.USE_CLIENT_DEFAULT
    r = await client.post(req.path, json=req.body(model), timeout=timeout)
    if r.status_code != 200:
        raise _Malformed(f"HTTP {r.status_code}: {error_detail(r)}")
    choices = r.json()["choices"]
    _check_finishes(req, {c["index"]: c["finish_reason"] for c in choices})


async def _streamed(client: httpx.AsyncClient, req: SoakRequest, model: str) -> bool:
    """Read one stream; True when the client closed it on purpose (mid_stream abort)."""
    finishes: dict[int, str | None] = {}
    chunks, done = 0, False
    async with client.stream("POST", req.path, json=req.body(model)) as r:
        if r.status_code != 200:
            await r.aread()
            raise _Malformed(f"HTTP {r.status_code}: {error_detail(r)}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                raise _Malformed(f"stream error event: {event['error'].get('message')}")
            for choice in event["choices"]:
                finishes.setdefault(choice["index"], None)
                if choice.get("finish_reason"):
                    finishes[choice["index"]] = choice["finish_reason"]
            chunks += 1
            if req.abort == "mid_stream" and chunks >= req.abort_after_chunks:
                return True  # leaving the block closes the connection
    if not done:
        raise _Malformed("stream ended without [DONE]")
    _check_finishes(req, finishes)
    return False


async def _one(client: httpx.AsyncClient, req: SoakRequest, model: str) -> SoakOutcome:
    start = time.perf_counter()

    def outcome(kind: str, reason: str | None = None) -> SoakOutcome:
        return SoakOutcome(req.index, kind, time.perf_counter() - start, reason)

    try:
        if not req.stream:
            await _plain(client, req, model)
            return outcome("completed")
        if req.abort == "timeout":
            async with asyncio.timeout(req.timeout_s):
                await _streamed(client, req, model)
            return outcome("completed")
        closed = await _streamed(client, req, model)
        return outcome("aborted", "mid_stream") if closed else outcome("completed")
    except (TimeoutError, httpx.TimeoutException) as e:
        if req.abort == "timeout":
            return outcome("aborted", "timeout")
        return outcome("failed", f"client safety timeout: {error_message(e)}")
    except _Malformed as e:
        return outcome("failed", str(e))
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        return outcome("failed", error_message(e))


async def run_soak(
    base_url: str,
    plan: list[SoakRequest],
    model: str,
    concurrency: int = 8,
    api_key: str | None = None,
    request_timeout_s: float = 120.0,
) -> tuple[list[SoakOutcome], float]:
    """Send `plan` to `base_url` (server root, no ``/v1``) with at most `concurrency`
    requests in flight; returns (outcomes in plan order, wall seconds).

    request_timeout_s: httpx timeout of requests not planned to time out; reaching it is
    a failure (a hung request)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 2)
    gate = asyncio.Semaphore(concurrency)

    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=request_timeout_s, limits=limits
    ) as client:

        async def gated(req: SoakRequest) -> SoakOutcome:
            async with gate:
                return await _one(client, req, model)

        start = time.perf_counter()
        outcomes = await asyncio.gather(*(gated(r) for r in plan))
        return list(outcomes), time.perf_counter() - start


def summarize_soak(
    plan: list[SoakRequest], outcomes: list[SoakOutcome], wall_s: float
) -> dict[str, Any]:
    """Counts and latencies of one soak run.

    Returns {"requests", "completed", "aborted" ({"mid_stream", "timeout"}), "failed",
    "failures" ({reason: count}), "latency_ms" (p50 / p99 / max of completed requests,
    None when none completed), "wall_s", "completed_per_s", "mix" (request counts by
    route, streaming, n and planned abort)}.
    """
    by_kind = Counter(o.kind for o in outcomes)
    aborted = Counter(o.reason for o in outcomes if o.kind == "aborted")
    latencies = [o.latency_s for o in outcomes if o.kind == "completed"]

    def ms(q: float) -> float | None:
        value = percentile(latencies, q)
        return None if value is None else round(1000 * value, 1)

    return {
        "requests": len(outcomes),
        "completed": by_kind["completed"],
        "aborted": {kind: aborted[kind] for kind in _ABORTS},
        "failed": by_kind["failed"],
        "failures": dict(Counter(o.reason for o in outcomes if o.kind == "failed")),
        "latency_ms": {"p50": ms(50), "p99": ms(99), "max": ms(100)},
        "wall_s": round(wall_s, 2),
        "completed_per_s": round(by_kind["completed"] / wall_s, 2) if wall_s > 0 else None,
        "mix": {
            "chat": sum(r.route == "chat" for r in plan),
            "completion": sum(r.route == "completion" for r in plan),
            "stream": sum(r.stream for r in plan),
            "n2": sum(r.n == 2 for r in plan),
            "planned_aborts": dict(Counter(r.abort for r in plan if r.abort)),
        },
    }


def format_soak(summary: dict[str, Any]) -> str:
    """A small markdown table of `summarize_soak`'s result, then one line per failure
    reason."""
    lat = summary["latency_ms"]
    ab = summary["aborted"]
    lines = [
        "| requests | completed | aborted mid-stream | aborted timeout | failed "
        "| p50 ms | p99 ms | max ms | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {summary['requests']} | {summary['completed']} | {ab['mid_stream']} "
        f"| {ab['timeout']} | {summary['failed']} | {lat['p50']} | {lat['p99']} "
        f"| {lat['max']} | {summary['wall_s']} |",
    ]
    lines += [f"failed x{n}: {reason}" for reason, n in summary["failures"].items()]
    return "\n".join(lines)
