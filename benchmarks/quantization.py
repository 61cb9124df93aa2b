"""Quantization methods on SmolLM2-135M side by side: per method the weight bytes, KV bytes
per token, decode step time at batch 1 and 32, prefill tokens/s, and the `radixlm eval`
summary against the fp32 baseline, in one table; writes benchmarks/results/quantization.json.

    python benchmarks/quantization.py                 # every method, default sizes
    python benchmarks/quantization.py --methods fp32,fp16-kv --quick

A method is a set of engine flags (`METHODS`); a method whose checkpoint must first be
written (W4A16, W8A8 int8) gets a compressed-tensors directory from
`write_quantized_checkpoint` (round to nearest, no calibration). A method the engine
refuses (flags it does not parse, a checkpoint it cannot load) is reported as
"unsupported: <reason>" and the table goes on. Methods run one after another, one engine
loaded at a time; each engine is timed, then evaluated by the same engine.

Note: the bundled model is a Q4_1 GGUF file, so every method starts from the same
Q4_1-rounded weights: "fp32" is that file dequantized, and "gguf-q4_1" computes with its
packed blocks (same values, so it differs from fp32 only by summation order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.eval.cli import add_args, build
from radixlm.eval.configs import EvalConfig, parse_config
from radixlm.eval.report import config_entry
from radixlm.eval.runner import RunOptions, compare, run_config, score
from radixlm.eval.targets import EngineTarget

RESULTS = Path(__file__).parent / "results" / "quantization.json"
# The checkpoint writer lives beside the loader tests (tests/quant_checkpoints.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Method:
    """A quantization method: engine flags, and `scheme` when a quantized checkpoint
    directory must be written first (then passed as --model)."""

    name: str
    flags: str
    scheme: str | None = None


METHODS = (
    Method("fp32", "--weight-format fp32"),
    Method("bf16", "--weight-format fp32 --dtype bfloat16"),
    Method("fp16", "--weight-format fp32 --dtype float16"),
    Method("fp16-kv", "--weight-format fp32 --kv-cache-dtype float16"),
    Method("gguf-q4_1", "--weight-format gguf"),
    Method("w4a16", "", scheme="w4a16"),
    Method("w8a8-int8", "", scheme="w8a8-int8"),
    Method("fp8-kv", "--weight-format fp32 --kv-cache-dtype fp8_e4m3"),
)


def write_quantized_checkpoint(scheme: str, model: str, out_dir: Path) -> Path:
    """Write `model` (an alias or Hugging Face directory) quantized with `scheme` as a
    compressed-tensors directory under `out_dir` and return it: "w4a16" = int4 weights,
    symmetric, group 64 (SmolLM2's hidden size 576 is not a multiple of the usual 128);
    "w8a8-int8" = int8 per-channel weights with per-token int8 activations. Round to
    nearest, no calibration (the writer the loader tests use, tests/quant_checkpoints.py)."""
    from radixlm.runtime.executor.model_registry import local_hf_dir
    from tests.quant_checkpoints import write_compressed_tensors

    kind, group = {"w4a16": ("w4a16", 64), "w8a8-int8": ("w8a8_int8", 32)}[scheme]
    dst = out_dir / scheme
    write_compressed_tensors(Path(local_hf_dir(model)), dst, kind, group)
    return dst


def _decode_step_ms(engine, prompt: list[int], batch: int, steps: int) -> float:
    """Median wall time, ms, of the decode steps of `batch` greedy requests (EOS ignored)
    after all have finished their prefill."""
    params = {"max_new_tokens": steps + 2, "temperature": 0.0, "ignore_eos": True}
    rids = [
        engine.add_request(input_ids=[*prompt, i], sampling_params=params) for i in range(batch)
    ]
    started: set[str] = set()
    while len(started) < len(rids):  # prefill steps until every request has a token
        started.update(c["rid"] for c in engine.step() if c["output_ids"])
    times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[:-1] or times)


def _prefill_tps(engine, prompt_len: int, reps: int) -> float:
    """Prompt tokens/s of one `prompt_len`-token prefill (no prefix-cache hit: each
    repetition's prompt differs from its first token)."""
    best = float("inf")
    for r in range(reps):
        ids = [(r * 7919 + i * 31) % 40000 + 100 for i in range(prompt_len)]
        t = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
        best = min(best, time.perf_counter() - t)
    return prompt_len / best


def _timed_opener(timings: dict[str, dict], args: argparse.Namespace):
    def opener(config: EvalConfig) -> EngineTarget:
        target = EngineTarget(config)
        e = target.engine
        prompt = e.tokenizer.encode("The history of the printing press begins")
        timings[config.name] = {
            "decode_step_ms_bs1": _decode_step_ms(e, prompt, 1, args.decode_steps),
            "decode_step_ms_bs32": _decode_step_ms(e, prompt, 32, args.decode_steps),
            "prefill_tokens_per_s": _prefill_tps(e, args.prefill_len, 2),
        }
        return target

    return opener


def _config(method: Method, args: argparse.Namespace, work: Path) -> EvalConfig:
    """The method's configuration. Raises the reason it is unsupported."""
    flags = f"--model {MODEL} --max-total-tokens {args.max_total_tokens} {method.flags}"
    if method.scheme:
        flags += f" --model {write_quantized_checkpoint(method.scheme, MODEL, work)}"
    return parse_config(f"{method.name}={flags}", method.name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(p)  # the eval flags (--num-prompts, --gen-len, --tasks, ...)
    p.add_argument("--methods", default=",".join(m.name for m in METHODS))
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--work-dir", default="/tmp/radixlm-quant-ckpts")
    p.add_argument("--quick", action="store_true", help="small eval sizes")
    p.set_defaults(lm_eval="off", out=str(RESULTS))
    args = p.parse_args()
    if args.quick:
        args.num_prompts, args.gen_len, args.kv_long_tokens = 4, 64, 1000
    known = {m.name: m for m in METHODS}
    methods = [known[n] for n in args.methods.split(",")]
    _, tasks, tokenizer = build(args)  # baseline flags: the engine defaults (smollm2-135m)
    opts = RunOptions(args.gen_len, args.top_k, args.exact_max_tokens, args.json_max_tokens)
    timings: dict[str, dict] = {}
    runs, entries = [], []
    for method in methods:
        try:
            config = _config(method, args, Path(args.work_dir))
        except (ValueError, NotImplementedError) as e:
            entries.append({"name": method.name, "unsupported": str(e)})
            continue
        run = run_config(config, tasks, tokenizer.encode, opts, _timed_opener(timings, args))
        if run.error:
            entries.append({"name": method.name, "unsupported": run.error})
            continue
        print(f"{method.name}: ran in {run.seconds:.0f} s", file=sys.stderr)
        base = runs[0] if runs else None
        vs = compare(base, run, tasks) if base else None
        runs.append(run)
        entries.append({**config_entry(run, score(run, tasks), vs), **timings[method.name]})
    print(format_rows(entries))
    doc = {"model": MODEL, "baseline": runs[0].config.name if runs else None,
           "tasks": {t.name: len(t.items) for t in tasks}, "options": vars(opts),
           "methods": entries}  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


#: Columns of the table: (header, key in a method's entry, its scores or its summary).
COLUMNS = (
    ("weights MB", lambda e: e["weights_bytes"] / 1e6),
    ("KV B/tok", lambda e: e["kv_bytes_per_token"]),
    ("step bs1 ms", lambda e: e["decode_step_ms_bs1"]),
    ("step bs32 ms", lambda e: e["decode_step_ms_bs32"]),
    ("prefill tok/s", lambda e: e["prefill_tokens_per_s"]),
    ("greedy agree", lambda e: _vs(e, "greedy.agreement")),
    ("1st div", lambda e: _vs(e, "greedy.first_divergence_median")),
    ("KL", lambda e: _vs(e, "teacher.kl_mean")),
    ("top1", lambda e: _vs(e, "teacher.top1_agreement")),
    ("ppl", lambda e: e["scores"].get("teacher.perplexity")),
    ("arith", lambda e: e["scores"].get("arith.accuracy")),
    ("kv-short", lambda e: e["scores"].get("kv-short.accuracy")),
    ("kv-long", lambda e: e["scores"].get("kv-long.accuracy")),
    ("json c/f", lambda e: _json_pair(e["scores"])),
)


def _vs(entry: dict[str, Any], key: str) -> float | None:
    return (entry["vs_baseline"] or {}).get("summary", {}).get(key)


def _json_pair(scores: dict[str, float]) -> str:
    c, f = scores.get("json.json_valid_constrained"), scores.get("json.json_valid_free")
    return "-" if c is None else f"{c:.2f}/{f:.2f}"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_rows(entries: list[dict[str, Any]]) -> str:
    """One row per method; an unsupported method's row gives the reason."""
    header = ["method"] + [h for h, _ in COLUMNS]
    rows = []
    for e in entries:
        if "unsupported" in e:
            rows.append([e["name"], f"unsupported: {e['unsupported']}"])
            continue
        rows.append([e["name"]] + [_fmt(get(e)) for _, get in COLUMNS])
    widths = [
        max([len(header[i])] + [len(r[i]) for r in rows if len(r) > 2]) for i in range(len(header))
    ]
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    out += [
        "  ".join(c.rjust(w) for c, w in zip(r, widths))
        if len(r) > 2
        else f"{r[0].rjust(widths[0])}  {r[1]}"
        for r in rows
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
