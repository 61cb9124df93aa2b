"""`radixlm eval`: compare candidate configurations with a baseline on the same prompts.

    radixlm eval --candidate "fp16kv=--kv-cache-dtype float16" \\
        --candidate "bf16=--dtype bfloat16" --out eval.json
    radixlm eval --baseline http://127.0.0.1:30000 --candidate q4=http://127.0.0.1:30001

Each configuration is `radixlm serve`'s flags (in-process, one engine loaded at a time) or
a running server's URL; the baseline defaults to the engine's defaults (smollm2-135m,
float32). Prints one table and, with --out, writes the JSON (docs/quantization.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from radixlm.eval import lm_eval_bridge
from radixlm.eval.configs import EvalConfig, parse_config
from radixlm.eval.report import config_entry, format_table
from radixlm.eval.runner import RunOptions, compare, run_config, score
from radixlm.eval.tasks import TASKS, Task, TaskSpec, generate_tasks, read_task_file

DEFAULT_TASKS = ",".join(TASKS)


def add_args(p: argparse.ArgumentParser) -> None:
    """The flags of `radixlm eval`."""
    p.add_argument(
        "--baseline",
        default="",
        help="the reference configuration: '[NAME=]FLAGS' (radixlm serve's flags, e.g. "
        "'--model smollm2-135m --dtype float32') or '[NAME=]URL' of a running server "
        "(default: the engine's defaults, named 'baseline')",
    )
    p.add_argument(
        "--candidate",
        action="append",
        default=[],
        help="a configuration compared with the baseline, as --baseline; repeatable",
    )
    p.add_argument(
        "--tasks",
        default=DEFAULT_TASKS,
        help=f"comma-separated generated tasks, '' for none (default: {DEFAULT_TASKS})",
    )
    p.add_argument(
        "--task-file",
        action="append",
        default=[],
        help="a local task KIND=PATH.jsonl, KIND one of greedy, teacher, exact, json "
        "(fields in radixlm/eval/tasks.py); repeatable",
    )
    p.add_argument("--num-prompts", type=int, default=8, help="items per generated task")
    p.add_argument("--gen-len", type=int, default=256, help="greedy tokens per prompt")
    p.add_argument("--kv-short-tokens", type=int, default=256, help="kv-short prompt tokens")
    p.add_argument("--kv-long-tokens", type=int, default=1500, help="kv-long prompt tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated tasks")
    p.add_argument("--top-k", type=int, default=20, help="logprobs per position for the KL")
    p.add_argument("--exact-max-tokens", type=int, default=8, help="tokens per exact answer")
    p.add_argument("--json-max-tokens", type=int, default=96, help="tokens per JSON answer")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer for the prompts (default: the baseline's model; needed when the "
        "baseline is a URL serving another model than smollm2-135m)",
    )
    p.add_argument(
        "--lm-eval",
        choices=["auto", "off", "on"],
        default="auto",
        help="also score the exact-match and perplexity tasks with lm-evaluation-harness "
        "(its local-completions model against each URL configuration): auto = when "
        "lm_eval is importable (or --lm-eval-python is given), on = fail without it",
    )
    p.add_argument(
        "--lm-eval-python",
        default=None,
        help="python of a virtual environment holding lm-eval (default: this one)",
    )
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning"])


def register(sub) -> None:
    """Add the `eval` subcommand to the `radixlm` command's subparsers."""
    p = sub.add_parser(
        "eval",
        help="compare quantized or other configurations with a baseline (docs/quantization.md)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_args(p)
    p.set_defaults(func=main)


def _check(args: argparse.Namespace) -> None:
    for name in ("num_prompts", "gen_len", "kv_short_tokens", "kv_long_tokens", "top_k"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")


def build(args: argparse.Namespace) -> tuple[list[EvalConfig], list[Task], Any]:
    """The configurations (baseline first), the tasks and the tokenizer of `args`.

    Raises:
        ValueError: bad flags of a configuration, an unknown task, an unreadable or
            malformed task file, a tokenizer that is not local, no task at all.
    """
    from radixlm.bench.preflight import load_local_tokenizer

    _check(args)
    configs = [parse_config(args.baseline, "baseline")]
    configs += [parse_config(s, f"candidate{i + 1}") for i, s in enumerate(args.candidate)]
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must differ: {names}")
    files = [read_task_file(s) for s in args.task_file]
    base = configs[0]
    tokenizer = load_local_tokenizer(args.tokenizer or base.model)
    spec = TaskSpec(
        n=args.num_prompts,
        gen_len=args.gen_len,
        kv_short_tokens=args.kv_short_tokens,
        kv_long_tokens=args.kv_long_tokens,
        seed=args.seed,
    )
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    tasks = generate_tasks(names, spec, lambda s: len(tokenizer.encode(s))) + files
    if not tasks:
        raise ValueError("no task: give --tasks or --task-file")
    return configs, tasks, tokenizer


def evaluate(
    configs: list[EvalConfig], tasks: list[Task], encode, opts: RunOptions
) -> list[dict[str, Any]]:
    """Run and score every configuration (the first is the baseline); one JSON entry each
    (`report.config_entry`)."""
    runs = [run_config(c, tasks, encode, opts) for c in configs]
    base = runs[0]
    entries = []
    for i, r in enumerate(runs):
        vs = None if i == 0 or r.error or base.error else compare(base, r, tasks)
        entries.append(config_entry(r, score(r, tasks), vs))
    return entries


def main(args: argparse.Namespace) -> int:
    """Run `radixlm eval`; 0 when every configuration ran, 1 when one failed (its error
    is in the table). Bad input raises ValueError (the command exits 2)."""
    logging.getLogger("radixlm").setLevel(args.log_level.upper())
    configs, tasks, tokenizer = build(args)
    lm = lm_eval_bridge.plan(args.lm_eval, args.lm_eval_python)
    opts = RunOptions(
        gen_len=args.gen_len,
        top_k=args.top_k,
        exact_max_tokens=args.exact_max_tokens,
        json_max_tokens=args.json_max_tokens,
    )
    entries = evaluate(configs, tasks, tokenizer.encode, opts)
    tokenizer_name = args.tokenizer or configs[0].model
    lm_result = lm_eval_bridge.run_all(lm, configs, tasks, tokenizer_name, args.exact_max_tokens)
    print(format_table(entries))
    print(lm_eval_bridge.describe(lm_result))
    if args.out:
        doc = {
            "baseline": configs[0].name,
            "tasks": {t.name: {"kind": t.kind, "items": len(t.items)} for t in tasks},
            "options": vars(opts),
            "seed": args.seed,
            "configs": entries,
            "lm_eval": lm_result,
        }
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 1 if any(e["error"] for e in entries) else 0
