"""Soak `radixlm serve` with a long fixed-seed mix of requests and client aborts.

Method
------
* Server: ``--base-url`` of a running server, or (default) a fresh ``radixlm serve
  --model smollm2-135m --port 0`` started here with ``--num-threads`` (1),
  ``--max-total-tokens`` (256: small, so the scheduler retracts) and
  ``--schedule-conservativeness`` (0.3), stopped with SIGTERM at the end.
* Workload (`radixlm.bench.soak.soak_plan`, ``--seed``): ``--num-requests`` requests,
  chat and text completions, streamed and not, n of 1 or 2, 4-24 new tokens; a share
  ``--abort-rate`` is abandoned by the client, half closing the stream after 1-3 chunks,
  half by a 0.05-0.5 s client timeout. At most ``--concurrency`` requests in flight.
* Outcome per request: completed (a well-formed 200 answer), aborted (the planned
  abort), or failed (any non-200, an error event in a stream, a malformed answer, a
  transport error, a hang past ``--request-timeout``). Latencies: client send -> last
  byte of completed requests, p50 / p99 / max (linear interpolation).
* Around the run: a greedy probe before and after must answer the same text; after the
  run the server must settle (nothing running or waiting, no KV held) within 30 s and its
  pool invariant free + evictable + protected + held == total must hold.

Output: a table on stdout and JSON at ``--output`` (default
``benchmarks/results/soak.json``). The exit status is 1 when a request failed or a
post-run check did not hold.

    python benchmarks/soak.py --num-requests 200
    python benchmarks/soak.py --base-url http://127.0.0.1:30000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import httpx
from engine_throughput import machine_info
from report import save_report
from serve_latency import start_server, stop_server

from radixlm.bench.server_checks import greedy_probe, settled_report, wait_settled
from radixlm.bench.soak import format_soak, run_soak, soak_plan, summarize_soak

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "soak.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", help="root URL of a running server (default: start one here)")
    p.add_argument("--api-key", default=None, help="API key of the server at --base-url")
    p.add_argument("--model", default="smollm2-135m", help="model to serve / request")
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    p.add_argument("--abort-rate", type=float, default=0.2, help="fraction abandoned (0..1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    p.add_argument("--request-timeout", type=float, default=120.0, help="hang bound, s")
    p.add_argument("--num-threads", type=int, default=1, help="server compute threads")
    p.add_argument("--max-total-tokens", type=int, default=256, help="server KV pool")
    p.add_argument("--schedule-conservativeness", type=float, default=0.3)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    if args.num_requests < 1 or args.concurrency < 1 or not 0 <= args.abort_rate <= 1:
        p.error("--num-requests and --concurrency must be >= 1, --abort-rate in [0, 1]")
    return args


async def soak(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Probe, soak, settle, probe again; the report's results."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        before = await greedy_probe(client, args.model)
        plan = soak_plan(args.num_requests, seed=args.seed, abort_rate=args.abort_rate)
        outcomes, wall = await run_soak(
            url, plan, args.model, args.concurrency, args.api_key, args.request_timeout
        )
        try:
            settled = settled_report(await wait_settled(client, timeout_s=30))
        except TimeoutError as e:
            settled = {"error": str(e)}
        after = await greedy_probe(client, args.model)
    return {
        "summary": summarize_soak(plan, outcomes, wall),
        "after_run": settled,
        "probe": {"before": before, "after": after, "unchanged": before == after},
    }


def checks_pass(result: dict[str, Any]) -> bool:
    """No request failed, the server settled with no KV held and a balanced pool, and the
    greedy probe did not change."""
    state = result["after_run"]
    return (
        result["summary"]["failed"] == 0
        and state.get("held") == 0
        and state.get("pool_balanced") is True
        and result["probe"]["unchanged"]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    proc, url = None, args.base_url
    if url is None:
        print("starting radixlm serve ...", file=sys.stderr)
        pool = ("--schedule-conservativeness", str(args.schedule_conservativeness))
        proc, url = start_server(args, pool)
    load_before = os.getloadavg()
    try:
        result = asyncio.run(soak(url.rstrip("/"), args))
    finally:
        if proc is not None:
            stop_server(proc)
    state = result["after_run"]
    print(format_soak(result["summary"]))
    print(
        f"after the run: held {state.get('held')}, pool balanced {state.get('pool_balanced')}, "
        f"retracted {state.get('retracted_total')}, probe unchanged {result['probe']['unchanged']}"
        + (f"; {state['error']}" if "error" in state else "")
    )
    report = {
        "benchmark": "soak",
        "args": {k: v for k, v in vars(args).items() if k != "api_key"},
        "server": "started here" if args.base_url is None else args.base_url,
        "machine": {**machine_info(), "load_before_after": (load_before, os.getloadavg())},
        **result,
        "checks_pass": checks_pass(result),
    }
    save_report(report, args.output)
    return 0 if report["checks_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
