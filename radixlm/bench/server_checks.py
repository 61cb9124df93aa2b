"""What a soak checks on the server around its run, over HTTP only: a greedy probe whose
text must not change, and the idle state afterwards (nothing running or waiting, no KV
held, the pool invariant free + evictable + protected + held == total).

The fields are those of ``GET /get_server_info``: ``num_running``, ``num_waiting``,
``memory`` (token counts: ``free``, ``evictable``, ``protected``, ``held``, ``total``) and
``scheduler`` (cumulative counters such as ``num_retracted_total``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

PROBE_MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROBE_MAX_TOKENS = 16


async def greedy_probe(client: httpx.AsyncClient, model: str) -> str:
    """The text of a fixed greedy chat completion (PROBE_MESSAGES, PROBE_MAX_TOKENS).

    Raises httpx.HTTPStatusError on a non-2xx answer."""
    body = {
        "model": model,
        "messages": PROBE_MESSAGES,
        "max_tokens": PROBE_MAX_TOKENS,
        "temperature": 0,
    }
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def pool_balanced(memory: dict[str, int]) -> bool:
    """The pool invariant on ``/get_server_info``'s ``memory``."""
    parts = memory["free"] + memory["evictable"] + memory["protected"] + memory["held"]
    return parts == memory["total"]


async def wait_settled(client: httpx.AsyncClient, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll ``/get_server_info`` until num_running == num_waiting == 0 and no KV is held
    (aborts reach the scheduler a moment after the client leaves); returns that info.

    Raises TimeoutError with the last counters when that has not happened after
    `timeout_s` seconds (requests or KV left behind: a leak or a hang)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = await client.get("/get_server_info")
        r.raise_for_status()
        info = r.json()
        if info["num_running"] == 0 and info["num_waiting"] == 0 and info["memory"]["held"] == 0:
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"server busy {timeout_s} s after the soak: running {info['num_running']}, "
                f"waiting {info['num_waiting']}, memory {info['memory']}"
            )
        await asyncio.sleep(0.05)


def settled_report(info: dict[str, Any]) -> dict[str, Any]:
    """The post-soak facts from a settled `/get_server_info` payload: held KV tokens,
    whether the pool invariant holds, the memory breakdown and the scheduler's retracted /
    aborted request totals."""
    sched = info["scheduler"]
    return {
        "held": info["memory"]["held"],
        "pool_balanced": pool_balanced(info["memory"]),
        "memory": info["memory"],
        "retracted_total": sched["num_retracted_total"],
        "aborted_total": sched["num_aborted_total"],
    }
