"""Goodput against request rate: fixed chunked-prefill sizes vs the SLO scheduler.

Method
------
* Configurations, one fresh `radixlm serve` each (bundled SmolLM2-135M unless
  ``--model``; ``--server-args`` are added to every one): ``chunk 128``, ``chunk 512``,
  ``chunk 2048`` (``--chunked-prefill-size``), and ``slo`` (``--slo-ttft-ms`` /
  ``--slo-tpot-ms`` at the benchmark's SLO pair; the scheduler chooses each step's
  budget, docs/slo.md).
* Workloads, each run with ``radixlm bench --sweep-rate`` at the same rates and the same
  SLO pair: ``mixed`` (random prompts uniform in [input_len / 16, input_len] tokens: long
  and short prompts together) and ``multi-turn`` (sessions whose turns extend the
  previous turn's context). Goodput fraction = requests meeting both TTFT and TPOT /
  successful requests (`radixlm.bench.stats.goodput`).
* Output: one PNG (a panel per workload, goodput fraction against request rate, a line
  per configuration) and one JSON (``--out`` with ``.json``: every curve, the highest
  rate per workload and configuration at which the goodput fraction stays >= 0.9 (None:
  not even the lowest rate), the arguments and the machine). Each sweep's own bench JSON
  goes to a temporary folder.

    python benchmarks/slo.py --quick                      # CPU: small prompts, 3 rates
    python benchmarks/slo.py --rates 1,2,4,8,16 --ttft-ms 500 --tpot-ms 50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS: dict[str, list[str]] = {
    "chunk 128": ["--chunked-prefill-size", "128"],
    "chunk 512": ["--chunked-prefill-size", "512"],
    "chunk 2048": ["--chunked-prefill-size", "2048"],
    "slo": [],  # the SLO flags are added per run
}
GOOD = 0.9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rates", default="1,2,4,8", help="comma-separated request rates (req/s)")
    p.add_argument("--ttft-ms", type=float, default=2000.0, help="TTFT SLO, ms")
    p.add_argument("--tpot-ms", type=float, default=200.0, help="TPOT SLO, ms")
    p.add_argument("--num-prompts", type=int, default=48, help="requests (sessions) per rate")
    p.add_argument("--input-len", type=int, default=2048, help="longest mixed prompt, tokens")
    p.add_argument("--output-len", type=int, default=32, help="output tokens per request")
    p.add_argument("--server-args", default="", help="extra `radixlm serve` flags")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"a subset of {', '.join(CONFIGS)}")
    p.add_argument("--quick", action="store_true", help="16 requests, 3 rates, prompts <= 512")
    p.add_argument("--out", type=Path, default=RESULTS / "slo.png")
    args = p.parse_args(argv)
    if args.quick:
        args.rates, args.num_prompts, args.input_len, args.output_len = "0.5,1,2", 16, 512, 16
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, flags: list[str]) -> tuple[subprocess.Popen, str]:
    """`radixlm serve` with `flags`; returns (process, base URL) once /health is 200."""
    port = free_port()
    cmd = [sys.executable, "-m", "radixlm", "serve", "--model", args.model, "--port", str(port)]
    cmd += flags + args.server_args.split()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise RuntimeError("server did not start in 600 s")


def workload_flags(args: argparse.Namespace, name: str) -> list[str]:
    if name == "mixed":
        return [
            "--dataset-name", "random",
            "--random-input-len", str(args.input_len),
            "--random-range-ratio", "0.0625",
            "--random-output-len", str(args.output_len),
        ]  # fmt: skip
    return [
        "--dataset-name", "multi-turn",
        "--multi-turn-system-len", str(args.input_len // 4),
        "--multi-turn-output-len", str(args.output_len),
    ]  # fmt: skip


def sweep(args: argparse.Namespace, url: str, workload: str, out_json: Path) -> dict[float, float]:
    """Goodput fraction per rate of one `radixlm bench --sweep-rate` run."""
    cmd = [
        sys.executable, "-m", "radixlm", "bench", "--backend", "radixlm", "--base-url", url,
        "--model", args.model, "--num-prompts", str(args.num_prompts),
        "--sweep-rate", args.rates, "--slo-ttft-ms", str(args.ttft_ms),
        "--slo-tpot-ms", str(args.tpot_ms), "--disable-tqdm",
        "--plot", str(out_json.with_suffix(".png")), "--output-json", str(out_json),
        *workload_flags(args, workload),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    points = json.loads(out_json.read_text())["points"]
    return {float(p["request_rate"]): float(p["goodput"]["fraction"]) for p in points}


def highest_good_rate(curve: dict[float, float]) -> float | None:
    """The highest rate up to which every measured rate keeps goodput >= GOOD."""
    best = None
    for rate in sorted(curve):
        if curve[rate] < GOOD:
            break
        best = rate
    return best


def plot(curves: dict[str, dict[str, dict[float, float]]], args: argparse.Namespace) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
    for ax, (workload, by_config) in zip(axes[0], curves.items()):
        for config, curve in by_config.items():
            rates = sorted(curve)
            ax.plot(rates, [curve[r] for r in rates], marker="o", label=config)
        ax.axhline(GOOD, color="grey", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("goodput fraction")
        ax.set_title(f"{workload}: TTFT <= {args.ttft_ms:g} ms, TPOT <= {args.tpot_ms:g} ms")
        ax.set_ylim(0, 1.05)
        ax.legend()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out)
    return args.out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    slo_flags = ["--slo-ttft-ms", str(args.ttft_ms), "--slo-tpot-ms", str(args.tpot_ms)]
    curves: dict[str, dict[str, dict[float, float]]] = {"mixed": {}, "multi-turn": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs.split(","):
            flags = CONFIGS[config]
            proc, url = start_server(args, flags + (slo_flags if config == "slo" else []))
            try:
                for workload in curves:
                    out_json = Path(tmp) / f"{workload}_{config.replace(' ', '')}.json"
                    curves[workload][config] = sweep(args, url, workload, out_json)
            finally:
                proc.terminate()
                proc.wait(60)
    png = plot(curves, args)
    best = {w: {c: highest_good_rate(curve) for c, curve in by.items()} for w, by in curves.items()}
    result = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "curves": {
            w: {c: {str(r): f for r, f in cv.items()} for c, cv in by.items()}
            for w, by in curves.items()
        },
        "highest_rate_goodput_ge_90pct": best,
    }
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(f"\nhighest rate with goodput >= {GOOD:.0%} (plot: {png})")
    for workload, by_config in best.items():
        for config, rate in by_config.items():
            print(f"  {workload:<11} {config:<11} {'none' if rate is None else f'{rate:g} req/s'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
