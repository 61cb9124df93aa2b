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

from radixlm.bench import flags, preflight
from radixlm.bench import sweep as sweep_mod
from radixlm.bench import workloads as wl
from radixlm.bench.backends import BACKENDS, make_backend
from radixlm.bench.preflight import load_local_tokenizer
from radixlm.bench.runner import run
from radixlm.bench.stats import format_summary, summarize

DATASETS = ("random", "generated-shared-prefix", "multi-turn", "sharegpt")


def load_tokenizer(name: str):
    """A Hugging Face tokenizer for a radixlm model alias, .gguf, local directory or hub
    name already in the local Hugging Face cache (never downloaded). Raises ValueError
    (one line) when there is no such local tokenizer."""
    return load_local_tokenizer(name)


def build_workload(
    args: argparse.Namespace,
    tokenizer,
    seed: int,
    sharegpt_pairs: list[tuple[str, str]] | None = None,
) -> list[wl.Session]:
    """The sessions of `--dataset-name` with its flags; a sharegpt workload is built from
    `sharegpt_pairs` (`wl.read_sharegpt`) when given, else from --dataset-path. Raises
    ValueError for bad flags or a bad dataset file."""
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
        tokenizer,
        args.dataset_path if sharegpt_pairs is None else sharegpt_pairs,
        args.num_prompts,
        args.sharegpt_output_len,
        seed,
    )


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by parsed `radixlm bench` flags; return the report
    (also printed, and written to --output-json when given).

    Before any request: the flags and the dataset file are checked, the server is
    probed (GET /v1/models) and the tokenizer is loaded from local files. Raises
    ValueError (one line) when one of these fails; failed requests do not raise, they
    are counted in the report with their errors."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    rates = sweep_mod.parse_rates(args.sweep_rate) if args.sweep_rate else [args.request_rate]
    if not rates[0] > 0:
        raise ValueError("--request-rate must be > 0 (inf sends everything at once)")
    flags.check_combinations(args)
    pairs = wl.read_sharegpt(args.dataset_path) if args.dataset_name == "sharegpt" else None
    cards = preflight.probe_models(args.base_url, args.api_key)
    model = args.model
    if args.backend == "openai" and model is None:
        model = preflight.served_model(cards, args.base_url)
    names = preflight.tokenizer_candidates(args.tokenizer, model, cards)
    tokenizer = preflight.find_tokenizer(names, explicit=bool(args.tokenizer))
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
        sessions = build_workload(args, tokenizer, args.seed + i, pairs)
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
    """The `radixlm bench` flags; numeric values are checked as they are parsed
    (radixlm.bench.flags), so a bad one is an argparse error (exit status 2)."""
    a = p.add_argument
    count, length, tokens = flags.positive_int, flags.non_negative_int, flags.positive_int
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
        help="tokenizer for building prompts: a radixlm model alias (smollm2-135m), a local "
        "Hugging Face directory, a .gguf file, or a hub name already in the local Hugging "
        "Face cache; never downloaded. Default: the model name (--model, else with --backend "
        "openai the first name the server lists in /v1/models), then the local path the "
        "server reports as that model's root; with --backend radixlm and no --model, "
        "smollm2-135m. Pass it when the served name is not a local model (a server started "
        "with --served-model-name on another machine)",
    )
    a("--api-key", default=None, help="bearer token for the server")
    a("--dataset-name", choices=DATASETS, default="random", help="workload (default: random)")
    a("--dataset-path", default=None, help="ShareGPT-style JSON file (sharegpt)")
    a(
        "--num-prompts",
        type=count,
        default=64,
        help="requests (random, sharegpt) or sessions (multi-turn), >= 1 (default: 64)",
    )
    a("--random-input-len", type=tokens, default=256, help="tokens, >= 1 (default: 256)")
    a("--random-output-len", type=tokens, default=64, help="tokens, >= 1 (default: 64)")
    a(
        "--random-range-ratio",
        type=flags.ratio,
        default=1.0,
        help="lengths uniform in [len * ratio, len], ratio in [0, 1] (default: 1.0 = fixed)",
    )
    a("--gsp-num-groups", type=count, default=4, help="shared-prefix groups G (default: 4)")
    a("--gsp-prompts-per-group", type=count, default=8, help="prompts per group P (default: 8)")
    a("--gsp-system-prompt-len", type=length, default=512, help="system tokens S (default: 512)")
    a("--gsp-question-len", type=length, default=64, help="question tokens Q (default: 64)")
    a("--gsp-output-len", type=tokens, default=64, help="output tokens (default: 64)")
    a("--multi-turn-num-turns", type=count, default=4, help="turns per session (default: 4)")
    a(
        "--multi-turn-system-len",
        type=length,
        default=256,
        help="first-turn context tokens (default: 256)",
    )
    a("--multi-turn-turn-len", type=length, default=64, help="user tokens per turn (default: 64)")
    a("--multi-turn-output-len", type=tokens, default=32, help="output per turn (default: 32)")
    a(
        "--sharegpt-output-len",
        type=tokens,
        default=None,
        help="override the reference answers' lengths (tokens, >= 1)",
    )
    a(
        "--request-rate",
        type=flags.request_rate,
        default=math.inf,
        help="Poisson arrival rate of sessions per s, > 0 (default: inf = all at once)",
    )
    a("--max-concurrency", type=count, default=None, help="cap on requests in flight (>= 1)")
    a(
        "--sweep-rate",
        type=flags.rate_list,
        default=None,
        help="comma-separated rates, e.g. 1,2,4,inf: run each, "
        "plot the throughput-latency curve to --plot",
    )
    a("--plot", default="bench_sweep.png", help="PNG path of a sweep (default: %(default)s)")
    a(
        "--slo-ttft-ms",
        type=flags.positive_float,
        default=None,
        help="TTFT SLO for goodput (ms, > 0)",
    )
    a(
        "--slo-tpot-ms",
        type=flags.positive_float,
        default=None,
        help="TPOT SLO for goodput (ms, > 0)",
    )
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
    """Exit status: 0, or 1 when a run completed no request (its most frequent error is
    printed to stderr). Unreachable servers, bad flags, dataset files and tokenizers
    raise ValueError (printed as one line by `radixlm`, exit status 2)."""
    try:
        report = run_bench(args)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {args.base_url}: {e}") from None
    summaries = report.get("points") or [report["summary"]]
    status = 0
    for s in summaries:
        if s["completed"] == 0:
            status = 1
            errors = list(s.get("error_counts") or {}) or ["no request was sent"]
            at = f" at rate {s['request_rate']:g}" if len(summaries) > 1 else ""
            which = "most frequent error" if len(errors) > 1 else "error"
            print(
                f"radixlm bench: all {s['failed']} requests failed{at}; {which}: {errors[0]}",
                file=sys.stderr,
            )
    return status


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
