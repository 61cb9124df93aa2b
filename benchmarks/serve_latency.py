"""Latency of `radixlm serve` under concurrent streaming chat requests.

Method
------
* Server: ``--url`` of a running server, or (default) a fresh ``radixlm serve --model
  smollm2-135m --port 0`` started here with ``--num-threads`` (1) and
  ``--max-total-tokens`` (20000), stopped with SIGTERM at the end.
* Workload: for each concurrency level C (``--concurrency``, default 1 4 16), ``--waves``
  W (2) waves; a wave sends C streaming ``/v1/chat/completions`` requests at once and
  waits for all of them. Every request has the same system prompt (about 100 tokens)
  and its own user message, greedy, ``max_tokens`` M (``--max-tokens``, 32) with
  ``ignore_eos`` so each produces exactly M tokens (checked via ``usage``). One untimed
  request warms the server (and caches the system prompt) first.
* The client is httpx (asyncio) reading raw server-sent events; times are
  ``time.perf_counter`` on the client, so they include HTTP and JSON overhead.
* Per request: TTFT = send -> first chunk with text; ITL = gaps between successive
  text chunks (a chunk usually carries one token; text held back for an incomplete
  UTF-8 character arrives with the next); E2E = send -> [DONE]; TPOT = (E2E - TTFT) /
  (tokens - 1). Per level: p50 / p99 of each over all requests (nearest rank), and output
  tokens/s = completion tokens of the level / wall time of its waves. ``os.getloadavg()``
  is recorded per level: on a shared machine compare runs with similar load.

Output: a table on stdout and JSON at ``--output``
(default ``benchmarks/results/serve_latency.json``).

    python benchmarks/serve_latency.py --quick          # C=1,4, W=1, M=16
    python benchmarks/serve_latency.py                  # C=1,4,16, W=2, M=32
    python benchmarks/serve_latency.py --url http://127.0.0.1:30000 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from report import save_report

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "serve_latency.json"
SYSTEM = (
    "You are the support assistant of a bicycle shop. You answer questions about repairs, "
    "spare parts, opening hours and rentals. Answer in two or three friendly sentences, "
    "mention prices only when asked, and suggest booking a repair slot online when a "
    "bike needs more than a quick fix."
)
QUESTIONS = [
    "How much is a new inner tube?",
    "Can you true a wheel today?",
    "Do you rent cargo bikes?",
    "My chain skips in high gears. Why?",
    "When do you open on Sundays?",
    "Do you sell helmets for children?",
    "How long does a full service take?",
    "Can I bring my own parts for a repair?",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="base URL of a running server (default: start one here)")
    p.add_argument("--api-key", default=None, help="API key of the server at --url")
    p.add_argument("--model", default="smollm2-135m", help="model to serve / request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--waves", type=int, default=2, help="waves of C requests per level")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    p.add_argument("--num-threads", type=int, default=1, help="server compute threads")
    p.add_argument("--max-total-tokens", type=int, default=20000, help="server KV pool")
    p.add_argument("--quick", action="store_true", help="smoke run: C=1,4, 1 wave, 16 tokens")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.waves, args.max_tokens = [1, 4], 1, 16
    if min(args.concurrency) < 1 or args.waves < 1 or args.max_tokens < 2:
        p.error("--concurrency and --waves must be >= 1, --max-tokens >= 2")
    return args


# ---- server --------------------------------------------------------------------------


def start_server(
    args: argparse.Namespace, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str]:
    """`radixlm serve` (with `extra` flags) on a free loopback port; returns (process, URL)
    once it answers."""
    cmd = [
        sys.executable, "-m", "radixlm", "serve", "--model", args.model, "--port", "0",
        "--num-threads", str(args.num_threads), "--max-total-tokens", str(args.max_total_tokens),
        "--log-level", "warning", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("radixlm serving on "):
            return proc, line.split()[-1]
    raise SystemExit(f"the server exited with status {proc.wait()} before it was ready")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- client --------------------------------------------------------------------------


async def one_request(client: httpx.AsyncClient, args, question: str) -> dict[str, Any]:
    """Stream one chat request; return its timings (seconds) and completion tokens."""
    body = {
        "model": args.model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    arrivals: list[float] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
            if chunk.get("usage"):
                usage = chunk["usage"]
    end = time.perf_counter()
    tokens = usage.get("completion_tokens", 0)
    if tokens != args.max_tokens or not arrivals:
        raise RuntimeError(f"expected {args.max_tokens} tokens, got {tokens}")
    ttft = arrivals[0] - start
    return {
        "ttft_s": ttft,
        "itl_s": [b - a for a, b in zip(arrivals, arrivals[1:])],
        "e2e_s": end - start,
        "tpot_s": (end - start - ttft) / (tokens - 1),
        "completion_tokens": tokens,
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "prompt_tokens": usage["prompt_tokens"],
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(level: int, requests: list[dict], wall_s: float, load: tuple) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": 1000 * percentile(values, 50),
            "p99_ms": 1000 * percentile(values, 99),
            "mean_ms": 1000 * sum(values) / len(values),
        }

    tokens = sum(r["completion_tokens"] for r in requests)
    return {
        "concurrency": level,
        "requests": len(requests),
        "ttft": stats([r["ttft_s"] for r in requests]),
        "itl": stats([gap for r in requests for gap in r["itl_s"]]),
        "tpot": stats([r["tpot_s"] for r in requests]),
        "e2e": stats([r["e2e_s"] for r in requests]),
        "output_tokens": tokens,
        "wall_s": wall_s,
        "output_tokens_per_s": tokens / wall_s,
        "cached_fraction": sum(r["cached_tokens"] for r in requests)
        / sum(r["prompt_tokens"] for r in requests),
        "loadavg_before_after": load,
    }


async def run_levels(url: str, args) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=600, limits=limits
    ) as client:
        await one_request(client, args, "Hello!")  # warm-up, untimed
        levels = []
        for level in args.concurrency:
            load_before = os.getloadavg()
            requests: list[dict] = []
            start = time.perf_counter()
            for wave in range(args.waves):
                questions = [QUESTIONS[(wave * level + i) % len(QUESTIONS)] for i in range(level)]
                tagged = [f"{q} (ticket {wave}-{i})" for i, q in enumerate(questions)]
                requests += await asyncio.gather(*(one_request(client, args, q) for q in tagged))
            wall = time.perf_counter() - start
            levels.append(summarize(level, requests, wall, (load_before, os.getloadavg())))
            print(f"  concurrency {level}: done in {wall:.1f} s", file=sys.stderr)
        return levels


def format_table(report: dict[str, Any]) -> str:
    header = (
        f"{'conc':>4} {'reqs':>4} | {'TTFT p50':>9} {'p99':>8} | {'ITL p50':>8} {'p99':>8} | "
        f"{'TPOT p50':>9} | {'E2E p50':>8} | {'out tok/s':>9} | {'cached':>6}"
    )
    lines = [header, "-" * len(header)]
    for lv in report["levels"]:
        lines.append(
            f"{lv['concurrency']:>4} {lv['requests']:>4} | "
            f"{lv['ttft']['p50_ms']:>7.0f}ms {lv['ttft']['p99_ms']:>6.0f}ms | "
            f"{lv['itl']['p50_ms']:>6.0f}ms {lv['itl']['p99_ms']:>6.0f}ms | "
            f"{lv['tpot']['p50_ms']:>7.0f}ms | {lv['e2e']['p50_ms']:>6.0f}ms | "
            f"{lv['output_tokens_per_s']:>9.1f} | {100 * lv['cached_fraction']:>5.0f}%"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        print("starting radixlm serve ...", file=sys.stderr)
        proc, url = start_server(args)
    try:
        levels = asyncio.run(run_levels(url.rstrip("/"), args))
    finally:
        if proc is not None:
            stop_server(proc)
    report = {
        "benchmark": "serve_latency",
        "server": {
            "url": args.url or "started here",
            "model": args.model,
            "num_threads": args.num_threads,
            "max_total_tokens": args.max_total_tokens,
        },
        "workload": {
            "concurrency": args.concurrency,
            "waves": args.waves,
            "max_tokens": args.max_tokens,
            "route": "/v1/chat/completions (stream, greedy, ignore_eos, shared system prompt)",
        },
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "levels": levels,
    }
    print(format_table(report))
    save_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
