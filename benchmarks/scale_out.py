"""Scale-out configurations under `radixlm bench`: one replica on two threads, two
replicas (one thread each) behind `radixlm router` under each routing policy, and a
prefill + decode pair (one thread each) behind `radixlm router --prefill-urls
--decode-urls`.

Method
------
* Model: the bundled SmolLM2-135M (float32, CPU), ``--max-total-tokens 20000`` per
  server. Servers start one configuration at a time (the machine may be shared).
* Workloads (`radixlm bench`, greedy, EOS ignored, all requests at once):
  ``multi-turn`` (``--num-prompts`` sessions of ``--turns`` turns: each turn resends the
  conversation so far) and ``generated-shared-prefix`` (G groups x P prompts sharing a
  system prompt). A fresh workload per run; ``/flush_cache`` before each run.
* The dp configurations are two `radixlm serve` workers behind `radixlm router` (the
  router's policies are the dispatcher's of ``--dp-size``; restarting a router per policy
  is cheaper than restarting a dp server).
* Reported per run: cache hit rate (cached prompt tokens / prompt tokens, as the workers
  report them), TTFT p50/p99, TPOT p50/p99 (ms), output tokens/s.
* KV transfer (prefill + decode pair, over both workloads): bytes and seconds per
  transferred request from the prefill worker's counters (`/get_server_info`
  ``disaggregation``), next to `radixlm plan disagg --gpu cpu` for the mean prompt
  length (its KV bytes, and its transfer time at its default 400 Gbit/s link).

    python benchmarks/scale_out.py            # writes benchmarks/results/scale_out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from radixlm.lang.backend.runtime import ready_url

MODEL = "smollm2-135m"
SERVE = (sys.executable, "-m", "radixlm", "serve", "--model", MODEL, "--port", "0")
POLICIES = ("cache_aware", "round_robin", "least_load")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=6, help="multi-turn sessions")
    p.add_argument("--turns", type=int, default=3, help="turns per multi-turn session")
    p.add_argument("--groups", type=int, default=2, help="shared-prefix groups")
    p.add_argument("--prompts-per-group", type=int, default=6)
    p.add_argument("--output-len", type=int, default=16, help="tokens per request")
    p.add_argument("--out", default="benchmarks/results/scale_out.json")
    return p.parse_args(argv)


def _start(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    log = tempfile.NamedTemporaryFile(prefix="scale-out-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    return proc, ready_url(proc, 600)


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _bench(url: str, workload: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp()) / "bench.json"
    cmd = [sys.executable, "-m", "radixlm", "bench", "--base-url", url, "--model", MODEL]
    cmd += ["--request-rate", "inf", "--disable-tqdm", "--seed", str(seed)]
    cmd += ["--output-json", str(out)]
    if workload == "multi-turn":
        cmd += ["--dataset-name", "multi-turn", "--num-prompts", str(args.num_prompts)]
        cmd += ["--multi-turn-num-turns", str(args.turns)]
        cmd += ["--multi-turn-system-len", "128", "--multi-turn-turn-len", "32"]
        cmd += ["--multi-turn-output-len", str(args.output_len)]
    else:
        cmd += ["--dataset-name", "generated-shared-prefix"]
        cmd += ["--gsp-num-groups", str(args.groups)]
        cmd += ["--gsp-prompts-per-group", str(args.prompts_per_group)]
        cmd += ["--gsp-system-prompt-len", "256", "--gsp-question-len", "32"]
        cmd += ["--gsp-output-len", str(args.output_len)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    s = json.loads(out.read_text())
    s = s.get("summary", s)
    return {
        "hit_rate": s["cache_hit_rate"],
        "ttft_p50_ms": s["ttft_ms"]["p50"],
        "ttft_p99_ms": s["ttft_ms"]["p99"],
        "tpot_p50_ms": s["tpot_ms"]["p50"],
        "tpot_p99_ms": s["tpot_ms"]["p99"],
        "output_tok_s": s["output_throughput"],
        "completed": s["completed"],
        "failed": s["failed"],
        "input_tokens": s["input_tokens"],
    }


def _runs(url: str, flush_urls: list[str], name: str, args, rows: list) -> None:
    for i, workload in enumerate(("multi-turn", "generated-shared-prefix")):
        for u in flush_urls:
            httpx.post(u + "/flush_cache", timeout=60)
        row = {"config": name, "workload": workload, **_bench(url, workload, args, 100 + i)}
        rows.append(row)
        print(_format([row], header=False), flush=True)


def _router(*flags: str) -> tuple[subprocess.Popen, str]:
    return _start([sys.executable, "-m", "radixlm", "router", "--port", "0", *flags])


def _plan(prompt: int, output: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "radixlm", "plan", "disagg", "--model", MODEL, "--gpu", "cpu"]
    cmd += ["--prompt", str(prompt), "--output", str(output), "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def _format(rows: list[dict], header: bool = True) -> str:
    cols = ("config", "workload", "hit_rate", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
            "tpot_p99_ms", "output_tok_s", "failed")  # fmt: skip
    lines = [" | ".join(f"{c:>14}" for c in cols)] if header else []
    for r in rows:
        cells = [f"{r[c]:>14.3f}" if isinstance(r[c], float) else f"{r[c]!s:>14}" for c in cols]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[dict] = []
    started = time.time()
    base = [*SERVE, "--max-total-tokens", "20000"]

    one, url = _start([*base, "--num-threads", "2"])
    try:
        _runs(url, [url], "1 replica x 2 threads", args, rows)
    finally:
        _stop(one)

    workers = [_start([*base, "--num-threads", "1"]) for _ in range(2)]
    urls = [u for _, u in workers]
    try:
        for policy in POLICIES:
            router, r_url = _router("--worker-urls", *urls, "--policy", policy)
            try:
                _runs(r_url, urls, f"2 replicas {policy}", args, rows)
            finally:
                _stop(router)
    finally:
        _stop(*(p for p, _ in workers))

    decode, d_url = _start([*base, "--num-threads", "1", "--disaggregation-mode", "decode",
                            "--disaggregation-bootstrap-port", "0"])  # fmt: skip
    prefill, p_url = _start([*base, "--num-threads", "1", "--disaggregation-mode", "prefill"])
    try:
        router, r_url = _router("--prefill-urls", p_url, "--decode-urls", d_url)
        try:
            _runs(r_url, [p_url, d_url], "prefill + decode", args, rows)
        finally:
            _stop(router)
        sent = httpx.get(p_url + "/get_server_info").json()["disaggregation"]
    finally:
        _stop(prefill, decode)

    pd_rows = [r for r in rows if r["config"] == "prefill + decode"]
    requests = sum(r["completed"] for r in pd_rows)
    mean_prompt = round(sum(r["input_tokens"] for r in pd_rows) / requests)
    plan = _plan(mean_prompt, args.output_len)
    n = sent["transfers"]
    transfer = {
        "transfers": n,
        "mean_prompt_tokens": mean_prompt,
        "measured_bytes_per_request": sent["bytes_sent"] / n,
        "measured_ms_per_request": 1e3 * sent["seconds_sent"] / n,
        "measured_gbit_s": 8 * sent["bytes_sent"] / sent["seconds_sent"] / 1e9,
        "plan_kv_bytes_per_request": plan["kv_bytes_per_request"],
        "plan_transfer_ms": plan["transfer_ms"],
        "plan_link_gbit_s": plan["link_bandwidth"] * 8 / 1e9,
        "plan_prefill_ms": plan["prefill_ms"],
    }
    print()
    print(_format(rows))
    print()
    for k, v in transfer.items():
        print(f"{k:>28}: {v:,.3f}" if isinstance(v, float) else f"{k:>28}: {v}")
    report = {
        "config": vars(args),
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "wall_s": time.time() - started,
        "rows": rows,
        "kv_transfer": transfer,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
