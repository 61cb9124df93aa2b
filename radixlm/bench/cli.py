"""`radixlm bench`: serving benchmark client (in the spirit of SGLang's bench_serving).

    radixlm bench --base-url http://127.0.0.1:30000 --dataset-name random \\
        --num-prompts 32 --random-input-len 256 --random-output-len 64 --request-rate 4
    radixlm bench --backend openai --base-url http://127.0.0.1:8000 --model NAME \\
        --tokenizer smollm2-135m --dataset-name generated-shared-prefix --max-concurrency 8
    radixlm bench --sweep-rate 0.5,1,2,4 --slo-ttft-ms 2000 --slo-tpot-ms 200 --plot sweep.png
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import httpx

from radixlm.bench import sweep as sweep_mod
from radixlm.bench import workloads as wl
from radixlm.bench.backends import BACKENDS, make_backend
from radixlm.bench.runner import run
from radixlm.bench.stats import format_summary, summarize

DATASETS = ("random", "generated-shared-prefix", "multi-turn", "sharegpt")


def load_tokenizer(name: str):
    """A Hugging Face tokenizer for a radixlm model alias, .gguf, local directory or hub
    name (hub names need the files in the local Hugging Face cache)."""
    from transformers import AutoTokenizer

    from radixlm.errors import ModelNotFoundError
    from radixlm.runtime.model_registry import local_hf_dir

    try:
        return AutoTokenizer.from_pretrained(local_hf_dir(name))
    except ModelNotFoundError:
        return AutoTokenizer.from_pretrained(name)


def build_workload(args: argparse.Namespace, tokenizer, seed: int) -> list[wl.Session]:
    """The sessions of `--dataset-name` with its flags. Raises ValueError for bad flags."""
    name = args.dataset_name
    if name == "random":
        return wl.random_workload(
            tokenizer,
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            seed,
        )
    if name == "generated-shared-prefix":
        return wl.shared_prefix_workload(
            tokenizer,
            args.gsp_num_groups,
            args.gsp_prompts_per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
            seed,
        )
    if name == "multi-turn":
        return wl.multi_turn_workload(
            tokenizer,
            args.num_prompts,
            args.multi_turn_num_turns,
            args.multi_turn_system_len,
            args.multi_turn_turn_len,
            args.multi_turn_output_len,
            seed,
        )
    if not args.dataset_path:
        raise ValueError("--dataset-name sharegpt needs --dataset-path FILE.json")
    return wl.sharegpt_workload(
        tokenizer, args.dataset_path, args.num_prompts, args.sharegpt_output_len, seed
    )


def _model_name(base_url: str, api_key: str | None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = httpx.get(f"{base_url.rstrip('/')}/v1/models", headers=headers, trust_env=False)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by parsed `radixlm bench` flags; return the report
    (also printed, and written to --output-json when given)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    rates = sweep_mod.parse_rates(args.sweep_rate) if args.sweep_rate else [args.request_rate]
    if not rates[0] > 0:
        raise ValueError("--request-rate must be > 0 (inf sends everything at once)")
    model = args.model
    if args.backend == "openai" and model is None:
        model = _model_name(args.base_url, args.api_key)
    tokenizer = load_tokenizer(args.tokenizer or model or "smollm2-135m")
    backend = make_backend(
        args.backend,
        args.base_url,
        model=model,
        api_key=args.api_key,
        ignore_eos=not args.disable_ignore_eos,
    )
    points = []
    for i, rate in enumerate(rates):
        # A fresh workload per rate (seed + i): earlier rates must not warm the cache.
        sessions = build_workload(args, tokenizer, args.seed + i)
        results, duration = run(
            backend,
            sessions,
            request_rate=rate,
            max_concurrency=args.max_concurrency,
            seed=args.seed,
            progress=not args.disable_tqdm,
        )
        s = summarize(results, duration, args.slo_ttft_ms, args.slo_tpot_ms)
        s["request_rate"] = rate
        title = f"{args.backend} {args.dataset_name} rate={rate:g}"
        print(format_summary(s, title), flush=True)
        points.append((s, results))
    config = {k: v for k, v in vars(args).items() if k != "func"}
    config["model"] = model
    if len(points) == 1:
        report: dict[str, Any] = {
            "config": config,
            "summary": points[0][0],
            "requests": [r.to_json() for r in points[0][1]],
        }
    else:
        summaries = [s for s, _ in points]
        analysis = sweep_mod.analyze(summaries, args.slo_ttft_ms, args.slo_tpot_ms)
        png = sweep_mod.plot_sweep(
            summaries,
            analysis,
            args.plot,
            args.slo_ttft_ms,
            args.slo_tpot_ms,
            title=f"{args.backend} {args.dataset_name}",
        )
        print(
            f"knee (TPOT p99): rate {analysis['knee_tpot_rate']}; knee (TTFT p99): rate "
            f"{analysis['knee_ttft_rate']}; operating point: rate "
            f"{analysis['operating_rate']}; plot: {png}"
        )
        report = {"config": config, "points": summaries, "analysis": analysis, "plot": str(png)}
    if args.output_json:
        out = Path(args.output_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `radixlm bench` flags."""
    a = p.add_argument
    a(
        "--backend",
        choices=sorted(BACKENDS),
        default="radixlm",
        help="radixlm: native /generate; openai: /v1/completions of any OpenAI-compatible "
        "server (vLLM, llama-server, ...) (default: radixlm)",
    )
    a("--base-url", default="http://127.0.0.1:30000", help="server root (default: %(default)s)")
    a(
        "--model",
        default=None,
        help="model name for OpenAI requests (default: the server's first /v1/models entry)",
    )
    a(
        "--tokenizer",
        default=None,
        help="tokenizer for prompt generation: radixlm alias, "
        "local dir or .gguf (default: --model, else smollm2-135m)",
    )
    a("--api-key", default=None, help="bearer token for the server")
    a("--dataset-name", choices=DATASETS, default="random", help="workload (default: random)")
    a("--dataset-path", default=None, help="ShareGPT-style JSON file (sharegpt)")
    a(
        "--num-prompts",
        type=int,
        default=64,
        help="requests (random, sharegpt) or sessions (multi-turn) (default: 64)",
    )
    a("--random-input-len", type=int, default=256, help="tokens (default: 256)")
    a("--random-output-len", type=int, default=64, help="tokens (default: 64)")
    a(
        "--random-range-ratio",
        type=float,
        default=1.0,
        help="lengths uniform in [len * ratio, len] (default: 1.0 = fixed)",
    )
    a("--gsp-num-groups", type=int, default=4, help="shared-prefix groups G (default: 4)")
    a("--gsp-prompts-per-group", type=int, default=8, help="prompts per group P (default: 8)")
    a("--gsp-system-prompt-len", type=int, default=512, help="system tokens S (default: 512)")
    a("--gsp-question-len", type=int, default=64, help="question tokens Q (default: 64)")
    a("--gsp-output-len", type=int, default=64, help="output tokens (default: 64)")
    a("--multi-turn-num-turns", type=int, default=4, help="turns per session (default: 4)")
    a("--multi-turn-system-len", type=int, default=256, help="first-turn context (default: 256)")
    a("--multi-turn-turn-len", type=int, default=64, help="user tokens per turn (default: 64)")
    a("--multi-turn-output-len", type=int, default=32, help="output per turn (default: 32)")
    a(
        "--sharegpt-output-len",
        type=int,
        default=None,
        help="override the reference answers' lengths",
    )
    a(
        "--request-rate",
        type=float,
        default=math.inf,
        help="Poisson arrival rate of sessions per s (default: inf = all at once)",
    )
    a("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    a(
        "--sweep-rate",
        default=None,
        help="comma-separated rates, e.g. 1,2,4,inf: run each, "
        "plot the throughput-latency curve to --plot",
    )
    a("--plot", default="bench_sweep.png", help="PNG path of a sweep (default: %(default)s)")
    a("--slo-ttft-ms", type=float, default=None, help="TTFT SLO for goodput (ms)")
    a("--slo-tpot-ms", type=float, default=None, help="TPOT SLO for goodput (ms)")
    a("--seed", type=int, default=0, help="workload and arrival seed (default: 0)")
    a("--disable-ignore-eos", action="store_true", help="let requests stop at EOS")
    a("--disable-tqdm", action="store_true", help="no progress bar")
    a("--output-json", default=None, help="write the report (summary + per request) here")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `bench` command to the `radixlm` subparsers."""
    p = subparsers.add_parser(
        "bench",
        help="benchmark a running server (throughput, TTFT/TPOT/ITL, goodput)",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(p)
    p.set_defaults(func=_command)
    return p


def _command(args: argparse.Namespace) -> int:
    """Exit status: 0, or 1 when a run completed no request. Unreachable servers and bad
    flags raise ValueError (printed as one line by `radixlm`)."""
    try:
        report = run_bench(args)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {args.base_url}: {e}") from None
    summaries = report.get("points") or [report["summary"]]
    return 0 if all(s["completed"] for s in summaries) else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m radixlm.bench.cli`: the same as `radixlm bench`."""
    parser = argparse.ArgumentParser(prog="radixlm bench", description=__doc__)
    add_arguments(parser)
    try:
        return _command(parser.parse_args(argv))
    except ValueError as e:
        print(f"radixlm bench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
