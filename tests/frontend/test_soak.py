"""Soak: a fixed-seed mix of chat and text completions, streamed and not, n of 1 and 2,
with client aborts mid-stream and by client timeout, on a KV pool small enough that the
scheduler must retract. Afterwards the server is idle with no KV held, the pool invariant
holds, and a greedy probe answers as it did before (radixlm/bench/soak.py drives it;
benchmarks/soak.py is the longer version)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from radixlm.bench.server_checks import greedy_probe, settled_report, wait_settled
from radixlm.bench.soak import run_soak, soak_plan, summarize_soak

from .conftest import MODEL, running_server

pytestmark = pytest.mark.slow

# 256 KV tokens hold about three of these requests (prompt 20-90 tokens, up to 2 x 48 new
# tokens); 8 in flight with an optimistic new-token estimate (0.3 x SGLang's) make decode
# run out of slots and retract.
POOL_ARGS = ("--max-total-tokens", "256", "--schedule-conservativeness", "0.3")
NUM_REQUESTS = 60
CONCURRENCY = 8
SOAK_BUDGET_S = 90.0  # a hang, not a slow machine, should trip this (12-40 s on 2 shared cores)
# A burst that must retract whatever the timing: each request writes 100 forced tokens, so
# any three decoding together outgrow the 256-slot pool, and the optimistic estimate
# (0.21 x 100 reserved each) admits all six at once.
PRESSURE_REQUESTS, PRESSURE_TOKENS = 6, 100


async def _pressure(client: httpx.AsyncClient) -> None:
    """Run the retraction burst; every request must still complete in full."""

    async def one(i: int) -> None:
        body = {
            "model": MODEL,
            "prompt": f"Request {i}: list the numbers from one upwards.",
            "max_tokens": PRESSURE_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        }
        resp = await client.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == PRESSURE_TOKENS

    await asyncio.gather(*(one(i) for i in range(PRESSURE_REQUESTS)))


@pytest.fixture(scope="module")
def soak_server():
    with running_server(*POOL_ARGS) as url:
        yield url


def test_soak_leaves_the_server_idle_balanced_and_unchanged(soak_server):
    async def main():
        async with httpx.AsyncClient(base_url=soak_server, timeout=60) as client:
            before = await greedy_probe(client, MODEL)
            await asyncio.wait_for(_pressure(client), SOAK_BUDGET_S)
            plan = soak_plan(NUM_REQUESTS, seed=0, abort_rate=0.25)
            outcomes, wall = await asyncio.wait_for(
                run_soak(soak_server, plan, MODEL, concurrency=CONCURRENCY), SOAK_BUDGET_S
            )
            info = await wait_settled(client, timeout_s=30)
            after = await greedy_probe(client, MODEL)
            return before, summarize_soak(plan, outcomes, wall), info, after

    before, summary, info, after = asyncio.run(main())
    assert summary["failed"] == 0, summary["failures"]
    assert summary["requests"] == NUM_REQUESTS
    mix = summary["mix"]
    assert mix["chat"] and mix["completion"] and mix["stream"] and mix["n2"]
    # Every kind of abort happened (abandoned requests ask for 48 forced tokens, far more
    # than a 0.05-0.5 s deadline or 1-3 chunks allow).
    assert summary["aborted"]["mid_stream"] == mix["planned_aborts"]["mid_stream"] > 0
    assert summary["aborted"]["timeout"] == mix["planned_aborts"]["timeout"] > 0
    assert summary["completed"] == NUM_REQUESTS - sum(mix["planned_aborts"].values())
    state = settled_report(info)
    assert info["num_running"] == 0 and info["num_waiting"] == 0
    assert state["held"] == 0
    assert state["pool_balanced"], state["memory"]
    assert state["memory"]["total"] == 256
    assert state["retracted_total"] > 0  # the burst outgrew the pool
    assert state["aborted_total"] > 0  # the scheduler saw client aborts
    assert after == before and before
