"""The LM head's greedy screen (`runtime/executor/layers/head_screen.py`) against the full
fp32 head, on final hidden states of real greedy decoding, and end to end.

Part 1 (the head alone): the bundled SmolLM2-135M generates greedily from the comparison
workloads' prompts while the head records its inputs; then, for each row count and
thread count, `PackedHead.forward` (the full fp32 head) and `PackedHead.argmax_logits`
(the screen) are timed alternately over the same recorded rows, and the screen's
candidates counted. The screen's form is the one this CPU gets (bfloat16 pairs with
AVX-512 BF16, else fp16); `--form fp16` forces the fp16 one.

Part 2 (end to end, `--workloads`): two in-process engines on the fp32 weights, one with
`--disable-lm-head-screen`, run each workload alternately (the harness of
`compare_engines.py`) and must produce the same tokens; the table gives the paired
speedup. `--speculative` runs both with n-gram speculation, whose greedy verify steps
take the screen too.

    python benchmarks/head_screen.py --threads 1 2 --workloads single,multiturn,shared16-warm
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_harness as harness  # noqa: E402
from compare_engines import RADIXLM_KV_TOKENS, build_workloads  # noqa: E402
from report import print_table_and_save  # noqa: E402

from radixlm.kernels.cpu import CpuKernels  # noqa: E402
from radixlm.runtime.executor.layers import head_screen  # noqa: E402
from radixlm.runtime.executor.layers.cpu_linear import PackedHead  # noqa: E402
from radixlm.runtime.executor.model_registry import local_hf_dir  # noqa: E402

MODEL = "smollm2-135m"


def _adapters(speculative: bool) -> dict[str, type]:
    """The two engines of the end-to-end A/B: with the screen and without, both with
    n-gram speculation (the goodput budget) when `speculative`."""
    base = harness.RadixlmNgramAdapter if speculative else harness.RadixlmAdapter

    class NoScreen(base):
        options = {**base.options, "disable_lm_head_screen": True}

    return {"screen": base, "off": NoScreen}


def record_states(tok, threads: int) -> tuple[PackedHead, torch.Tensor]:
    """The fp32 engine's PackedHead and the final hidden states (float32 [N, hidden]) it
    saw while decoding the burst16 and multiturn workloads greedily."""
    adapter = harness.RadixlmAdapter(str(local_hf_dir(MODEL)), threads,
                                     {"max_total_tokens": RADIXLM_KV_TOKENS})  # fmt: skip
    head = adapter.engine.runner.model.lm_head
    states: list[torch.Tensor] = []
    original = head.argmax_logits

    def recording(x):
        states.append(x.detach().clone())
        return original(x)

    head.argmax_logits = recording
    wls = {w["name"]: w for w in build_workloads(tok, False)}
    for name in ("burst16", "multiturn"):
        adapter.run(wls[name]["sessions"])
    head.argmax_logits = original
    return head, torch.cat(states)


def time_head(head: PackedHead, states: torch.Tensor, rows: int, threads: int, reps: int):
    """Median ms of the full head and of the screen over `reps` alternated calls, each on
    `rows` recorded states, and the screen's candidates per call (median, max)."""
    torch.set_num_threads(threads)
    kernels = head._gemm
    counts: list[int] = []
    original = type(kernels).screen_select

    def counted(k, *args):
        ids = original(k, *args)
        counts.append(-1 if ids is None else ids.numel())
        return ids

    full, screened = [], []
    type(kernels).screen_select = counted
    try:
        for r in range(reps):
            start = (r * rows) % max(1, states.shape[0] - rows)
            x = states[start : start + rows].contiguous()
            for fn, out in ((head.forward, full), (head.argmax_logits, screened))[
                :: 1 - 2 * (r % 2)
            ]:
                t0 = time.perf_counter()
                fn(x)
                out.append(time.perf_counter() - t0)
    finally:
        type(kernels).screen_select = original
    counts.sort()
    return (statistics.median(full) * 1e3, statistics.median(screened) * 1e3,
            counts[len(counts) // 2], counts[-1])  # fmt: skip


def _finished_outputs(adapter, sessions) -> tuple[float, list]:
    """(wall s, sorted (session, turn, output ids)) of one harness run."""
    done: list = []
    original = harness.Timer.result

    def result(timer):
        done.append((timer.session, timer.turn, tuple(timer.output_ids)))
        return original(timer)

    harness.Timer.result = result
    try:
        t0 = time.perf_counter()
        adapter.run(sessions)
        return time.perf_counter() - t0, sorted(done)
    finally:
        harness.Timer.result = original


def end_to_end(
    tok, threads: int, workloads: list[str], reps: int, speculative: bool = False
) -> list[dict]:
    """Paired speedups of the screen over `reps` alternated repetitions per workload (with
    n-gram speculation when `speculative`: its verify steps take the screen too); exits
    if the two engines' output tokens differ."""
    d = str(local_hf_dir(MODEL))
    spec = {"max_total_tokens": RADIXLM_KV_TOKENS}
    engines = {key: cls(d, threads, spec) for key, cls in _adapters(speculative).items()}
    rows = []
    try:
        for name in workloads:
            wall: dict[str, list[float]] = {"screen": [], "off": []}
            for r in range(reps):
                wls = {w["name"]: w for w in build_workloads(tok, False, seed=r)}
                tokens = {}
                for key in ("screen", "off")[:: 1 - 2 * (r % 2)]:
                    if name == "shared16-warm":
                        engines[key].run(wls["shared16-cold"]["sessions"])
                    seconds, tokens[key] = _finished_outputs(engines[key], wls[name]["sessions"])
                    wall[key].append(seconds)
                if tokens["screen"] != tokens["off"]:
                    raise SystemExit(f"{name}: the screen changed the outputs")
            ratios = [b / a for a, b in zip(wall["screen"], wall["off"])]
            rows.append({"threads": threads, "workload": name, "speculative": speculative,
                         "screen_s": statistics.median(wall["screen"]),
                         "off_s": statistics.median(wall["off"]),
                         "speedup": statistics.median(ratios),
                         "speedup_min": min(ratios), "speedup_max": max(ratios)})  # fmt: skip
    finally:
        for e in engines.values():
            e.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="(default 1 2)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--reps", type=int, default=21, help="alternated head calls (default 21)")
    ap.add_argument("--form", choices=["auto", "fp16"], default="auto")
    ap.add_argument("--workloads", default="", help="end-to-end A/B, e.g. single,multiturn")
    ap.add_argument("--e2e-reps", type=int, default=6, help="(default 6)")
    ap.add_argument(
        "--speculative", action="store_true",
        help="end to end with n-gram speculation in both engines (verify steps screened)",
    )  # fmt: skip
    ap.add_argument("--output", default="benchmarks/results/head_screen.json")
    args = ap.parse_args(argv)
    if CpuKernels.load() is None:
        raise SystemExit("radixlm's CPU kernels are not available here")
    if args.form == "fp16":
        head_screen.ArgmaxScreen.product_for = staticmethod(head_screen.Fp16Product)
    load_before = os.getloadavg()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(local_hf_dir(MODEL))
    head, states = record_states(tok, max(args.threads))
    form = type(head.screen.product).__name__
    lines = [f"SmolLM2-135M head 49152 x 576, {states.shape[0]} recorded states, {form}", "",
             "| threads | rows | full head ms | screen ms | speedup | candidates median / max |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    head_rows = []
    for t in args.threads:
        for m in args.rows:
            if m > head.screen.rows:
                continue
            full, scr, med, most = time_head(head, states, m, t, args.reps)
            head_rows.append({"threads": t, "rows": m, "full_ms": full, "screen_ms": scr,
                              "candidates_median": med, "candidates_max": most})  # fmt: skip
            lines.append(
                f"| {t} | {m} | {full:.2f} | {scr:.2f} | {full / scr:.2f}x | {med} / {most} |"
            )
    e2e = []
    workloads = [w for w in args.workloads.split(",") if w]
    if workloads:
        lines += ["", "| threads | workload | screen s | without s | paired speedup (min-max) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for t in args.threads:
            for r in end_to_end(tok, t, workloads, args.e2e_reps, args.speculative):
                e2e.append(r)
                lines.append(
                    f"| {t} | {r['workload']} | {r['screen_s']:.3f} | {r['off_s']:.3f} | "
                    f"{r['speedup']:.3f} ({r['speedup_min']:.3f}-{r['speedup_max']:.3f}) |"
                )
    print_table_and_save(lines, Path(args.output), args, load_before, form=form,
                         head=head_rows, end_to_end=e2e)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
