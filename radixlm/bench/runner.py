"""Drives a workload against a backend: Poisson arrivals or a concurrency cap.

Arrivals: sessions start at the times of a Poisson process of rate `request_rate`
(exponential gaps, seeded; `inf` starts them all at once). Within a session, turn k+1
is sent when turn k's answer has arrived. `max_concurrency` caps the requests in flight
(a semaphore), with any rate. The run's duration is from the first send to the last
answer.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from typing import Any

import httpx
from tqdm.auto import tqdm

from radixlm.bench.backends import Backend
from radixlm.bench.stats import RequestResult
from radixlm.bench.workloads import Session


def arrival_offsets(n: int, request_rate: float, seed: int = 0) -> list[float]:
    """Start times (s from the run start) of `n` sessions: cumulative exponential gaps
    with mean 1 / request_rate; all 0 for an infinite rate. Raises ValueError for a
    rate <= 0."""
    if request_rate <= 0:
        raise ValueError(f"request rate must be > 0 (or inf), got {request_rate}")
    if math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(request_rate)
    return out


async def run_workload(
    backend: Backend,
    sessions: list[Session],
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
    progress: bool = True,
    timeout_s: float = 3600.0,
    encode: Callable[[str], list[int]] | None = None,
) -> tuple[list[RequestResult], float]:
    """Run every session; return the results (session order, turn order) and the
    duration in seconds. Later turns of a session whose turn failed are not sent and
    are reported as failed. Sessions of token-id turns need `encode` (text -> ids) for
    their history: the next prompt is prompt + encode(answer text) + the turn's ids."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    offsets = arrival_offsets(len(sessions), request_rate, seed)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    total = sum(s.num_requests() for s in sessions)
    bar = tqdm(total=total, desc="requests", unit="req", disable=not progress)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(timeout_s, connect=30.0)

    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:

        async def one(prompt: str | list[int], output_len: int) -> RequestResult:
            if sem is None:
                return await backend.send(client, prompt, output_len)
            async with sem:
                return await backend.send(client, prompt, output_len)

        async def session(s: Session, offset: float, t0: float) -> list[RequestResult]:
            await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
            results: list[RequestResult] = []
            history: str | list[int] = "" if isinstance(s.turns[0].text, str) else []
            for turn in s.turns:
                if results and not results[-1].success:
                    results.append(RequestResult(error="an earlier turn failed"))
                    bar.update()
                    continue
                prompt = history + turn.text if s.resend_history else turn.text
                res = await one(prompt, turn.output_len)
                if isinstance(prompt, str):
                    history = prompt + res.text
                elif s.resend_history:
                    if encode is None:
                        raise ValueError("multi-turn token-id sessions need `encode`")
                    history = prompt + encode(res.text)
                results.append(res)
                bar.update()
            return results

        t0 = time.perf_counter()
        per_session = await asyncio.gather(
            *(session(s, off, t0) for s, off in zip(sessions, offsets))
        )
        duration = time.perf_counter() - t0
    bar.close()
    return [r for rs in per_session for r in rs], duration


def run(
    backend: Backend, sessions: list[Session], **kwargs: Any
) -> tuple[list[RequestResult], float]:
    """Blocking `run_workload` (its own event loop)."""
    return asyncio.run(run_workload(backend, sessions, **kwargs))
