"""Speculative decoding: acceptance length, decode tokens/s and speed-up per drafter and
batch size on the bundled model, next to the planner's prediction (`radixlm.plan.spec`).

Method
------
* Prompts (``--workload``): ``chat`` = the held-out chat prompts of
  `radixlm.train.prompts` (topics absent from EAGLE training); ``copy`` =
  code-editing requests that repeat a snippet (where n-gram lookup pays). Chat-templated,
  cycled to fill a batch of B.
* Greedy, EOS ignored (every request emits exactly N tokens). For each engine and B:
  one run with max_new_tokens=1 (prefill + first token, t_1) and one with N
  (``--decode-tokens``, t_N), both after flushing the prefix cache; then
      decode tokens/s = B * (N - 1) / (t_N - t_1).
* Engines: no speculation, then each drafter (``--drafters``): ``ngram``; ``eagle``
  (``--eagle-path``, default the committed head); ``draft`` uses ``--draft-path``
  (default: the target itself, which shows the verification machinery at full
  acceptance but can never be faster: its draft costs as much as the target).
  Speculation is forced on at every batch size (--speculative-max-batch-size 1024).
* Acceptance length = tokens per verify step (scheduler counter deltas over the t_N
  run); draft share = drafter time / speculative step time.
* Planner: `SpecModel` on the measured local CPU (`radixlm plan` hardware "cpu") with
  acceptance a solved from the measured length E = (1 - a^(k+1)) / (1 - a) at B = 1 and
  draft cost c = draft time per step / (k * plain decode step) measured at B = 1.

    python benchmarks/speculative.py --quick   # batch 1 and 4, 24 tokens
    python benchmarks/speculative.py           # batch 1, 4, 16, 64
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch
from report import save_report

from radixlm import Engine
from radixlm.train.prompts import heldout_prompts

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_EAGLE = "smollm2-135m"  # the bundled head (radixlm/runtime/speculative/heads/)


_SNIPPET = '''def moving_average(values, window):
    """Average of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = sum(values[:window])
    out.append(total / window)
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        out.append(total / window)
    return out
'''

COPY_PROMPTS = [
    f"Rename the function below to `rolling_mean` and return the full code.\n\n{_SNIPPET}",
    f"Add type hints to this function and return the full code.\n\n{_SNIPPET}",
    f"Repeat this code exactly, then explain it in one sentence.\n\n{_SNIPPET}",
    f"Rename the argument `values` to `xs` and return the full code.\n\n{_SNIPPET}",
]
WORKLOAD = "chat"


def _prompts(tokenizer, n: int) -> list[list[int]]:
    texts = heldout_prompts() if WORKLOAD == "chat" else COPY_PROMPTS
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": texts[i % len(texts)]}],
            tokenize=True, add_generation_prompt=True, return_dict=False,
        )
        for i in range(n)
    ]  # fmt: skip


def _timed(engine: Engine, prompts, new: int) -> float:
    engine.flush_cache()
    t = time.perf_counter()
    outs = engine.generate(
        input_ids=prompts,
        sampling_params={"max_new_tokens": new, "temperature": 0, "ignore_eos": True},
    )
    assert all(len(o["output_ids"]) == new for o in outs)
    return time.perf_counter() - t


def measure(engine: Engine, batch: int, new: int) -> dict[str, Any]:
    prompts = _prompts(engine.tokenizer, batch)
    t1 = _timed(engine, prompts, 1)
    before = engine.scheduler.stats()
    tn = _timed(engine, prompts, new)
    after = engine.scheduler.stats()
    steps = after.get("spec_verify_steps_total", 0) - before.get("spec_verify_steps_total", 0)
    drafts = after.get("spec_draft_tokens_total", 0) - before.get("spec_draft_tokens_total", 0)
    acc = after.get("spec_accepted_tokens_total", 0) - before.get("spec_accepted_tokens_total", 0)
    return {
        "batch": batch,
        "t_1_s": t1,
        "t_n_s": tn,
        "decode_tok_s": batch * (new - 1) / max(tn - t1, 1e-9),
        "accept_length": (acc + steps) / steps if steps else 1.0,
        "accept_rate": acc / drafts if drafts else 0.0,
        "draft_time_share": after.get("spec_draft_time_share", 0.0),
        "decode_steps": after["num_decode_steps"] - before["num_decode_steps"],
    }


def _acceptance_from_length(length: float, k: int) -> float:
    """Solve (1 - a^(k+1)) / (1 - a) = length for a in [0, 1] by bisection."""
    from radixlm.plan.spec import expected_tokens

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < length else (lo, mid)
    return lo


def planner(length: float, k: int, draft_cost: float, batches: list[int]) -> dict[str, Any]:
    from radixlm.plan.cost import Deployment
    from radixlm.plan.hardware import get_hardware
    from radixlm.plan.models import load_model
    from radixlm.plan.spec import SpecModel

    dep = Deployment(load_model("smollm2-135m"), get_hardware("cpu"), "fp32", "fp32")
    a = _acceptance_from_length(min(length, k + 1.0), k)
    model = SpecModel(dep, a, k, context=160, draft_cost=draft_cost)
    return {
        "acceptance": a,
        "draft_cost": draft_cost,
        "speedup": {b: model.point(b).speedup for b in batches},
        "break_even_batch": model.break_even_batch(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--decode-tokens", type=int, default=48)
    p.add_argument("--drafters", nargs="+", default=["ngram", "eagle", "draft"])
    p.add_argument("--eagle-path", default=str(DEFAULT_EAGLE))
    p.add_argument("--draft-path", default="smollm2-135m")
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--budgets", nargs="+", default=["goodput"], choices=["goodput", "fixed"],
                   help="--speculative-budget of each drafter's engines")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workload", choices=["chat", "copy"], default="chat",
                   help="held-out chat prompts, or code edits that copy text")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="batch 1 and 4, 24 tokens")
    p.add_argument("--output", default=str(ROOT / "benchmarks/results/speculative.json"))
    args = p.parse_args()
    global WORKLOAD
    WORKLOAD = args.workload
    if args.quick:
        args.batch_sizes, args.decode_tokens = [1, 4], 24
    torch.set_num_threads(args.threads)
    k = args.num_draft_tokens
    common = dict(max_total_tokens=32768, max_running_requests=max(args.batch_sizes),
                  num_threads=args.threads, log_level="warning")  # fmt: skip
    spec = dict(speculative_max_batch_size=1024, speculative_num_draft_tokens=k,
                speculative_num_steps=k, speculative_topk=args.topk)  # fmt: skip
    engines: dict[str, dict] = {"none": {}}
    for d in args.drafters:
        extra = {"eagle": {"speculative_draft_path": args.eagle_path},
                 "draft": {"speculative_draft_path": args.draft_path}}.get(d, {})  # fmt: skip
        for budget in args.budgets:
            name = d if args.budgets == ["goodput"] else f"{d}/{budget}"
            engines[name] = {"speculative_algorithm": d, "speculative_budget": budget,
                             **spec, **extra}  # fmt: skip
    results: dict[str, list[dict]] = {}
    load = [os.getloadavg()[0]]
    for name, settings in engines.items():
        with Engine("smollm2-135m", **common, **settings) as engine:
            _timed(engine, _prompts(engine.tokenizer, 1), 4)  # warm-up
            results[name] = [measure(engine, b, args.decode_tokens) for b in args.batch_sizes]
        load.append(os.getloadavg()[0])
    base = {r["batch"]: r["decode_tok_s"] for r in results["none"]}
    print(f"{'drafter':13} {'batch':>5} {'accept len':>10} {'rate':>6} {'draft %':>7} "
          f"{'tok/s':>8} {'speed-up':>8} {'planner':>8}")  # fmt: skip
    plans = {}
    for name, rows in results.items():
        plan = None
        if name != "none":
            b1 = rows[0]
            step_s = (b1["t_n_s"] - b1["t_1_s"]) / max(b1["decode_steps"], 1)
            plain_step = 1.0 / base[b1["batch"]] * b1["batch"]
            c = b1["draft_time_share"] * step_s / (k * plain_step)
            plan = plans[name] = planner(b1["accept_length"], k, c, args.batch_sizes)
        for r in rows:
            r["speedup"] = r["decode_tok_s"] / base[r["batch"]]
            pred = plan["speedup"][r["batch"]] if plan else 1.0
            print(f"{name:13} {r['batch']:5d} {r['accept_length']:10.2f} {r['accept_rate']:6.2f} "
                  f"{100 * r['draft_time_share']:6.1f}% {r['decode_tok_s']:8.1f} "
                  f"{r['speedup']:8.2f} {pred:8.2f}")  # fmt: skip
    for name, plan in plans.items():
        measured = next((r["batch"] for r in results[name] if r["speedup"] <= 1.0), None)
        print(f"{name}: measured break-even batch {measured}, planner {plan['break_even_batch']} "
              f"(a={plan['acceptance']:.2f}, c={plan['draft_cost']:.3f})")  # fmt: skip
    save_report(
        {"settings": vars(args), "loadavg": load, "results": results, "planner": plans},
        Path(args.output),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
