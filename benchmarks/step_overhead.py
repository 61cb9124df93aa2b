"""Per-decode-step wall time of `radixlm.Engine`, split into model forward and the rest.

    OMP_NUM_THREADS=1 python benchmarks/step_overhead.py --batches 1 16 64 --steps 32

For each batch size B it queues B greedy requests (distinct random prompts of
`--prompt-len` tokens, EOS ignored), runs the engine until all B are decoding, then times
`--steps` decode steps of the engine's own loop (`Engine._step`: scheduler step,
sampling, stop checks, detokenization). Each step's time is split into

* forward: inside the model's ``forward`` (embeddings, layers incl. attention, head);
* attention: the part of forward spent in the attention backend (gathers + SDPA);
* metadata: the backend's per-step ``init_forward_metadata``;
* scheduler: the rest of ``Scheduler.step`` (batch building, sampling, stop checks);
* engine: the rest of ``Engine._step`` (detokenization, result bookkeeping).

overhead share = (step - forward) / step. Values are medians over the timed steps; with
``--repeat R`` the whole measurement runs R times and the table reports the median run.
Prints a markdown table and writes JSON to benchmarks/results/step_overhead.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import save_report  # noqa: E402


class _Clock:
    """Accumulates the time spent inside a wrapped callable."""

    def __init__(self) -> None:
        self.total = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t

        return timed


def measure(engine, batch: int, steps: int, prompt_len: int, seed: int) -> dict[str, float]:
    """Median per-step times (ms) of `steps` decode steps at batch size `batch`."""
    sched, runner = engine.scheduler, engine.runner
    fwd, attn, meta, sch = _Clock(), _Clock(), _Clock(), _Clock()
    model, backend = runner.model, runner.backend
    patches = [
        (model, "forward", fwd.wrap(model.forward)),
        (backend, "forward", attn.wrap(backend.forward)),
        (backend, "init_forward_metadata", meta.wrap(backend.init_forward_metadata)),
        (sched, "step", sch.wrap(sched.step)),
    ]
    for obj, name, fn in patches:
        setattr(obj, name, fn)
    rng = random.Random(seed)
    vocab = engine.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(batch)]
    params = {"max_new_tokens": steps + 8, "temperature": 0, "ignore_eos": True}
    rids = engine._submit_all(prompts, [engine._params(params, 1)[0]] * batch)
    rows: list[dict[str, float]] = []
    try:
        while sched.waiting or sched.chunked is not None or len(sched.running) < batch:
            engine._step()
        engine._step()  # first decode step after the prefills (warm-up)
        for _ in range(steps):
            clocks = (fwd, attn, meta, sch)
            for c in clocks:
                c.total = 0.0
            t = time.perf_counter()
            engine._step()
            step = time.perf_counter() - t
            rows.append(
                {
                    "step": step,
                    "forward": fwd.total,
                    "attention": attn.total,
                    "metadata": meta.total,
                    "scheduler": sch.total - fwd.total - meta.total,
                    "engine": step - sch.total,
                }
            )
    finally:
        engine._abort(rids)
        while sched.has_work():
            engine._step()
        engine.flush_cache()
        for obj, name, _ in patches:
            delattr(obj, name)
    out = {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}
    shares = [(r["step"] - r["forward"]) / r["step"] for r in rows]
    out["overhead_share"] = statistics.median(shares)
    out["tokens_per_s"] = batch / (out["step"] / 1e3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per run")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--label", default="", help="name of this code version in the JSON")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/step_overhead.json"))
    args = p.parse_args()

    import radixlm

    load = os.getloadavg()
    t = time.perf_counter()
    engine = radixlm.Engine(
        model=args.model, num_threads=args.threads, max_running_requests=max(args.batches)
    )
    load_s = time.perf_counter() - t
    runs: dict[int, list[dict[str, float]]] = {b: [] for b in args.batches}
    for r in range(args.repeat):
        for b in args.batches:
            runs[b].append(measure(engine, b, args.steps, args.prompt_len, seed=r))
    engine.shutdown()
    results = {}
    for b, rs in runs.items():
        best = sorted(rs, key=lambda x: x["step"])[len(rs) // 2]  # the median run
        results[b] = {
            **best,
            "step_min": min(x["step"] for x in rs),
            "step_max": max(x["step"] for x in rs),
        }
    name = args.label or "radixlm"
    print(f"\n{name}: {args.threads} thread(s), load {load} -> {os.getloadavg()}")
    print("| batch | step ms | forward ms | attention ms | metadata ms | scheduler ms "
          "| engine ms | overhead share | tokens/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for b, x in results.items():
        print(
            f"| {b} | {x['step']:.2f} ({x['step_min']:.2f}-{x['step_max']:.2f}) "
            f"| {x['forward']:.2f} | {x['attention']:.2f} | {x['metadata']:.2f} "
            f"| {x['scheduler']:.2f} | {x['engine']:.2f} | {x['overhead_share']:.1%} "
            f"| {x['tokens_per_s']:.1f} |"
        )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    report: dict[str, Any] = {
        "label": args.label,
        "commit": commit,
        "radixlm_file": radixlm.__file__,
        "threads": args.threads,
        "steps": args.steps,
        "prompt_len": args.prompt_len,
        "repeat": args.repeat,
        "engine_load_s": load_s,
        "load_before": load,
        "load_after": os.getloadavg(),
        "results_ms": results,
    }
    save_report(report, args.out)


if __name__ == "__main__":
    main()
