"""Decode speed with and without a JSON-schema grammar, side by side, on `radixlm.Engine`.

Method
------
* The bundled SmolLM2-135M-Instruct (float32, CPU, ``--threads`` compute threads,
  default 1), greedy decoding, B chat prompts per batch (``--batch-sizes``, default 1 8;
  B different requests for a person record).
* Constrained run: every request carries a nested JSON schema (`SCHEMA`: strings, an
  integer range, a nested object, an array) and runs until its grammar ends it (EOS
  after the closing brace). Each output is checked to parse and validate (jsonschema).
* Unconstrained twin: the same prompts with ``ignore_eos=True`` and ``max_new_tokens``
  set to each constrained request's output length, so both runs have the same batch
  size at every step; only the grammar work differs (bitmask fill per constrained row,
  mask application, token acceptance).
* Timing through the streaming API: t_first = when every request of the batch has its
  first token (the prefill step), t_last = the last chunk. Decode tokens/s =
  (tokens generated - B) / (t_last - t_first). The grammar cost per decode step is
  (constrained - unconstrained decode time) / decode steps; as that difference is
  small against a loaded machine's noise, the grammar work is also timed alone
  ("replay"): the recorded outputs are replayed through fresh matchers (bitmask fill and
  application on a [B, vocab] logits tensor, token acceptance) without the model.
* ``--repeats`` (3) alternate constrained and unconstrained runs (A-B-A-B) after one
  untimed warm-up of each; the table shows medians [min-max]. Grammar compile time is
  measured once cold (new compiler) and once from the cache. ``os.getloadavg()`` is
  recorded: compare runs on a shared machine only at similar load.

Output: a table on stdout and JSON at ``--output``
(default ``benchmarks/results/structured_output.json``).

    python benchmarks/structured_output.py            # batch 1 and 8, 3 repeats
    python benchmarks/structured_output.py --quick    # batch 1 and 4, 1 repeat
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from report import save_report

REPO_ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("radixlm") is None:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "structured_output.json"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "country": {"type": "string", "maxLength": 24},
            },
            "required": ["city", "country"],
        },
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "address", "hobbies"],
}
SUBJECTS = [
    "a teacher", "a pilot", "a painter", "a farmer", "a doctor", "a chef", "a student",
    "an athlete", "a poet", "a sailor", "a baker", "a nurse", "a judge", "a miner",
    "a singer", "a coder",
]  # fmt: skip
DECODE_DEF = "(tokens generated - B) / (t_last - t_first) over one batch, streamed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="radixlm model alias or path")
    p.add_argument("--threads", type=int, default=1, help="torch compute threads")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=160, help="cap per request")
    p.add_argument("--quick", action="store_true", help="batch 1 and 4, one repeat")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.repeats = [1, 4], 1
    return args


def prompts(engine, n: int) -> list[list[int]]:
    """n chat prompts asking for a JSON record of a different person each."""
    out = []
    for i in range(n):
        subject = SUBJECTS[i % len(SUBJECTS)]
        msg = [{"role": "user", "content": f"Describe {subject} as a JSON record."}]
        out.append(
            engine.tokenizer.apply_chat_template(
                msg, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    return out


def timed(engine, batch: list[list[int]], params: list[dict]) -> dict[str, Any]:
    """Stream one batch; returns the decode rate, the outputs and the load average."""
    load = os.getloadavg()[0]
    texts = [""] * len(batch)
    ids: list[list[int]] = [[] for _ in batch]
    firsts: dict[int, float] = {}
    t_last = 0.0
    for chunk in engine.generate(input_ids=batch, sampling_params=params, stream=True):
        now = time.perf_counter()
        i = chunk["index"]
        texts[i] += chunk["text"]
        ids[i] += chunk["output_ids"]
        if chunk["output_ids"]:
            firsts.setdefault(i, now)
            t_last = now
    t_first = max(firsts.values())
    counts = [len(x) for x in ids]
    decode_tokens = sum(counts) - len(batch)
    return {
        "decode_tokens_per_s": decode_tokens / (t_last - t_first),
        "decode_s": t_last - t_first,
        "decode_steps": max(counts) - 1,
        "tokens": counts,
        "texts": texts,
        "output_ids": ids,
        "loadavg": [load, os.getloadavg()[0]],
    }


def check_outputs(texts: list[str]) -> None:
    """Every constrained output parses and validates against SCHEMA (else raise)."""
    import jsonschema

    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def compile_times(engine) -> dict[str, float]:
    """Seconds to compile SCHEMA cold (a fresh compiler, tokenizer info included) and cached."""
    from radixlm.runtime.sampling.grammar import GrammarCompiler

    base = engine.scheduler.grammars.compiler
    fresh = GrammarCompiler(base.tokenizer, base.vocab_size, base.stop_token_ids)
    spec = json.dumps(SCHEMA)
    t0 = time.perf_counter()
    fresh.compile("json_schema", spec)
    t1 = time.perf_counter()
    fresh.compile("json_schema", spec)
    t2 = time.perf_counter()
    return {"cold_s": t1 - t0, "cached_s": t2 - t1}


def replay_ms_per_step(engine, outputs: list[list[int]]) -> float:
    """Grammar work alone: milliseconds per decode step to fill and apply the bitmask of
    every still-running row and accept its recorded token (no model forward)."""
    import torch

    from radixlm.runtime.sampling.grammar import GrammarBackend
    from radixlm.runtime.sampling.sampler import SamplingParams
    from radixlm.runtime.sched.request import Req

    backend = GrammarBackend(engine.scheduler.grammars.compiler)
    params = SamplingParams(json_schema=json.dumps(SCHEMA))
    reqs = [Req(rid=str(i), input_ids=[0], params=params) for i in range(len(outputs))]
    for r in reqs:
        backend.prepare(r)
    logits = torch.zeros(len(outputs), backend.compiler.vocab_size)
    steps = max(len(o) for o in outputs)
    t0 = time.perf_counter()
    for step in range(steps):
        rows = [(r, o[step]) for r, o in zip(reqs, outputs) if step < len(o)]
        backend.apply(logits[: len(rows)], [r for r, _ in rows])
        for r, tok in rows:
            backend.accept(r, tok)
    return (time.perf_counter() - t0) / steps * 1e3


def run_batch(engine, b: int, args: argparse.Namespace) -> dict[str, Any]:
    batch = prompts(engine, b)
    con = [
        {"temperature": 0, "max_new_tokens": args.max_new_tokens, "json_schema": json.dumps(SCHEMA)}
    ] * b
    warm = timed(engine, batch, con)  # also fixes the output lengths of the twin
    check_outputs(warm["texts"])
    unc = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in warm["tokens"]]
    timed(engine, batch, unc)
    runs: dict[str, list[dict]] = {"constrained": [], "unconstrained": []}
    for _ in range(args.repeats):
        r = timed(engine, batch, con)
        check_outputs(r["texts"])
        assert r["tokens"] == warm["tokens"], "greedy constrained output changed"
        runs["constrained"].append(r)
        u = timed(engine, batch, unc)
        assert u["tokens"] == warm["tokens"]
        runs["unconstrained"].append(u)
    rates = {k: [r["decode_tokens_per_s"] for r in v] for k, v in runs.items()}
    steps = warm["tokens"] and max(warm["tokens"]) - 1
    extra_ms = [
        (c["decode_s"] - u["decode_s"]) / max(steps, 1) * 1e3
        for c, u in zip(runs["constrained"], runs["unconstrained"])
    ]
    replay = [replay_ms_per_step(engine, warm["output_ids"]) for _ in range(args.repeats)]
    for v in runs.values():
        for r in v:
            r.pop("texts")
            r.pop("output_ids")
    return {
        "batch_size": b,
        "output_tokens": warm["tokens"],
        "sample_output": warm["texts"][0],
        "constrained": summarize(rates["constrained"]),
        "unconstrained": summarize(rates["unconstrained"]),
        "ratio_of_medians": statistics.median(rates["constrained"])
        / statistics.median(rates["unconstrained"]),
        "grammar_ms_per_decode_step": summarize(extra_ms),
        "grammar_ms_per_step_replay": summarize(replay),
        "runs": runs,
    }


def fmt(s: dict[str, float]) -> str:
    return f"{s['median']:7.1f} [{s['min']:.1f}-{s['max']:.1f}]"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import importlib.metadata as md

    import radixlm

    load_before = os.getloadavg()
    with radixlm.Engine(model=args.model, num_threads=args.threads, max_total_tokens=8192) as e:
        compile_s = compile_times(e)
        results = [run_batch(e, b, args) for b in args.batch_sizes]
    print(f"JSON schema compile: cold {compile_s['cold_s'] * 1e3:.1f} ms "
          f"(incl. tokenizer info), cached {compile_s['cached_s'] * 1e6:.1f} us")  # fmt: skip
    print(f"\ndecode tokens/s, {DECODE_DEF}; median [min-max] of {args.repeats}")
    head = ("batch", "constrained", "unconstrained", "ratio", "Δ ms/step", "replay ms/step")
    print(f"{head[0]:>5}  {head[1]:>22}  {head[2]:>22}  {head[3]:>6}  {head[4]:>9}  {head[5]:>14}")
    for r in results:
        g, rp = r["grammar_ms_per_decode_step"], r["grammar_ms_per_step_replay"]
        print(
            f"{r['batch_size']:>5}  {fmt(r['constrained']):>22}  {fmt(r['unconstrained']):>22}"
            f"  {r['ratio_of_medians']:6.3f}  {g['median']:9.2f}  {rp['median']:14.3f}"
        )
    report = {
        "benchmark": "structured_output",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "definitions": {"decode_tokens_per_s": DECODE_DEF},
        "schema": SCHEMA,
        "compile": compile_s,
        "results": results,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg": [load_before[0], os.getloadavg()[0]],
            "torch": md.version("torch"),
            "xgrammar": md.version("xgrammar"),
        },
    }
    save_report(report, args.output)


if __name__ == "__main__":
    main()
