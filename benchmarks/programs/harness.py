"""Runs program workloads on one backend and times every program (one engine, one run).

Started by run.py as a subprocess, one per engine and repetition (each engine starts
cold, in its own interpreter: OpenVINO's adapter runs under its venv's python with this
worktree on PYTHONPATH):

    python benchmarks/programs/harness.py --backend engine|endpoint|openai|openvino \\
        [--model-dir DIR] [--url URL] [--dialect vllm|llama.cpp] [--speculative ngram] \\
        --threads T --workloads few-shot,json,... [--quick | --programs N] --seed S \\
        --out result.json

All programs of a workload start at once (one thread each, as `run_batch` runs them) and
run greedy with EOS ignored. Before the timed workloads, one untimed few-shot program
(and one JSON program when that workload is chosen) runs on other inputs (seed + 1000)
to warm kernels and grammar caches.

Per workload the result holds: wall_s (first start to last finish), per-program latency
(seconds), the summed prompt / completion / cached tokens of the gen calls (cached: None
when the engine reports none), gen and select counts, semantic check failures (the
workload's `check`), and every program's final text (to compare engines' outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# This directory (the workloads) and the repository root (radixlm, for the peers' venvs).
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

from workloads import RUN_OPTIONS, WORKLOADS  # noqa: E402

from radixlm.lang.backend.base import Backend  # noqa: E402

SERVED_NAME = "smollm2-135m"
# Warm-up programs: few-shot always (kernels), json when chosen (schema compilation).
WARMUP = ("few-shot", "json")


class MeteredBackend(Backend):
    """Delegates to `inner` and sums the token counts of its gen calls (thread-safe)."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> dict[str, Any]:
        """Zero the counters; returns their values before."""
        with self._lock:
            before = getattr(self, "counts", None)
            self.counts: dict[str, Any] = dict.fromkeys(
                ("gens", "selects", "prompt_tokens", "completion_tokens"), 0
            )
            self.counts["cached_tokens"] = None
        return before or {}

    def _load_chat_template(self):
        return self.inner.chat_template

    def generate(self, prompt, options, on_delta=None):
        text, meta = self.inner.generate(prompt, options, on_delta)
        with self._lock:
            c = self.counts
            c["gens"] += 1
            c["prompt_tokens"] += meta.get("prompt_tokens") or 0
            c["completion_tokens"] += meta.get("completion_tokens") or 0
            if meta.get("cached_tokens") is not None:
                c["cached_tokens"] = (c["cached_tokens"] or 0) + meta["cached_tokens"]
        return text, meta

    def select(self, prompt, choices, temperature, method, rng=None):
        with self._lock:
            self.counts["selects"] += 1
        return self.inner.select(prompt, choices, temperature, method, rng)

    def cache_prefix(self, text):
        return self.inner.cache_prefix(text)

    def flush_cache(self):
        return self.inner.flush_cache()

    def get_server_info(self):
        return self.inner.get_server_info()

    def shutdown(self):
        self.inner.shutdown()


def make_backend(args: argparse.Namespace) -> tuple[Backend, Any]:
    """(backend, engine or None) for the command line's --backend."""
    from radixlm.lang import chat_template

    if args.backend == "engine":
        import radixlm
        from radixlm.lang.backend.engine import EngineBackend

        spec = {"speculative_algorithm": "ngram"} if args.speculative == "ngram" else {}
        engine = radixlm.Engine(model=args.model_dir, num_threads=args.threads,
                                max_total_tokens=args.kv_tokens,
                                disable_radix_cache=args.disable_radix_cache, **spec)  # fmt: skip
        return EngineBackend(engine), engine
    if args.backend == "endpoint":
        import radixlm as rl

        return rl.RuntimeEndpoint(args.url), None
    from transformers import AutoTokenizer

    template = chat_template.from_tokenizer(AutoTokenizer.from_pretrained(args.model_dir))
    if args.backend == "openai":
        from radixlm.lang.backend.openai import OpenAI

        backend = OpenAI(SERVED_NAME, base_url=args.url + "/v1", is_chat_model=False,
                         chat_template=template, structured_outputs=args.dialect,
                         timeout=600, max_retries=0)  # fmt: skip
        return backend, None
    from ov_backend import OpenVINOBackend

    lookup = args.speculative == "ngram"
    return OpenVINOBackend(args.model_dir, args.threads, args.kv_tokens, template, lookup), None


def run_workload(backend: MeteredBackend, name: str, inputs: list[dict[str, Any]]) -> dict:
    """Run every program of `name` at once on `backend`; the result dict (module doc)."""
    w = WORKLOADS[name]
    latency: list[float] = [0.0] * len(inputs)
    states: list[Any] = [None] * len(inputs)

    def one(i: int) -> None:
        t = time.perf_counter()
        states[i] = w.program.run(**inputs[i], backend=backend, **RUN_OPTIONS)
        states[i].sync()
        latency[i] = time.perf_counter() - t

    backend.reset()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(inputs)) as pool:
        errors = [f.exception() for f in [pool.submit(one, i) for i in range(len(inputs))]]
    wall = time.perf_counter() - t0
    counts = backend.reset()
    failures = []
    for i, (s, err) in enumerate(zip(states, errors)):
        err = err or (s.error() if s is not None else None)
        if err is not None:
            failures.append(f"program {i}: {type(err).__name__}: {err}"[:300])
            continue
        try:
            w.check(s, inputs[i])
        except (AssertionError, ValueError, KeyError) as e:
            failures.append(f"program {i} check: {type(e).__name__}: {e}"[:300])
    return {
        "programs": len(inputs),
        "wall_s": wall,
        "latency_s": latency,
        **counts,
        "failures": failures,
        "texts": [s.text() if s is not None and s.error() is None else None for s in states],
        "loadavg": os.getloadavg(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--backend", choices=("engine", "endpoint", "openai", "openvino"), required=True)
    add("--model-dir", help="fp32 safetensors dir (engine; tokenizer for openai) or OV IR dir")
    add("--url", help="server root (endpoint, openai)")
    add("--dialect", choices=("vllm", "llama.cpp"), default=None,
        help="how the OpenAI backend asks for select / JSON constraints")  # fmt: skip
    add("--threads", type=int, default=2)
    add("--kv-tokens", type=int, default=16384)
    add("--disable-radix-cache", action="store_true")
    add("--speculative", choices=("none", "ngram"), default="none",
        help="in-process engines: n-gram speculation (radixlm --speculative-algorithm "
        "ngram, OpenVINO prompt lookup); servers take theirs at launch")  # fmt: skip
    add("--workloads", default=",".join(WORKLOADS))
    add("--quick", action="store_true", help="each workload's quick program count")
    add("--programs", type=int, default=None, help="programs per workload (overrides sizes)")
    add("--seed", type=int, default=0)
    add("--out", required=True)
    args = p.parse_args(argv)
    if args.backend in ("endpoint", "openai") and not args.url:
        p.error(f"--backend {args.backend} needs --url (the server's root)")
    if args.backend != "endpoint" and not args.model_dir:
        p.error(f"--backend {args.backend} needs --model-dir")
    if args.speculative != "none" and args.backend not in ("engine", "openvino"):
        p.error(f"--speculative: the {args.backend} backend's server sets it at launch")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = [n for n in args.workloads.split(",") if n]
    t_load = time.perf_counter()
    inner, engine = make_backend(args)
    backend = MeteredBackend(inner)
    report: dict[str, Any] = {"load_s": time.perf_counter() - t_load, "workloads": {}}
    for name in WARMUP:  # one program each on other inputs, untimed
        if name in names or name == "few-shot":
            run_workload(backend, name, WORKLOADS[name].inputs(1, args.seed + 1000))
    report["warmup_s"] = time.perf_counter() - t_load - report["load_s"]
    for name in names:
        w = WORKLOADS[name]
        n = args.programs or (w.quick_n if args.quick else w.n)
        report["workloads"][name] = run_workload(backend, name, w.inputs(n, args.seed))
        print(f"{name}: {report['workloads'][name]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    backend.shutdown()
    if engine is not None:
        engine.shutdown()
    Path(args.out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
