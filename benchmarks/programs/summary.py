"""Per-run figures, their summary over repetitions, radixlm's paired ratios and the table.

A run is one engine's harness report for one repetition (harness.py). Throughput is
programs per second (every engine runs the same programs); output tokens/s counts the
completion tokens of gen calls (select excluded: radixlm scores choices without decoding,
a constrained-decoding select decodes a few tokens). Ratios are paired: within each
repetition radixlm's throughput over the peer's, then the median over repetitions
(a shared host drifts for minutes; engines of one repetition run back to back).
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks; None
    for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def run_figures(w: dict[str, Any], reference_texts: list[str | None] | None) -> dict[str, Any]:
    """One workload of one harness report as table figures (with the failed programs'
    messages, kept in the result file's runs). reference_texts: the reference engine's
    program texts of the same repetition (None: not compared)."""
    wall = w["wall_s"]
    cached = w.get("cached_tokens")
    same = None
    if reference_texts is not None:
        pairs = list(zip(w["texts"], reference_texts))
        same = sum(a is not None and a == b for a, b in pairs) / max(1, len(pairs))
    return {
        "programs_per_s": w["programs"] / wall,
        "output_tps": w["completion_tokens"] / wall,
        "latency_p50_s": percentile(w["latency_s"], 50),
        "latency_p99_s": percentile(w["latency_s"], 99),
        "cache_hit_rate": None if cached is None else cached / max(1, w["prompt_tokens"]),
        "failures": len(w["failures"]),
        "failure_messages": w["failures"],
        "same_text_as_reference": same,
        "wall_s": wall,
    }


def summarize(runs: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Figures over repetitions (None: that repetition did not run): throughput medians
    with min and max, latencies and cache hit rate of the median repetition."""
    done = [r for r in runs if r is not None]
    if not done:
        return {}
    med = sorted(done, key=lambda r: r["programs_per_s"])[len(done) // 2]
    pps = [r["programs_per_s"] for r in done]
    return {
        "programs_per_s": statistics.median(pps),
        "programs_per_s_min": min(pps),
        "programs_per_s_max": max(pps),
        "output_tps": statistics.median(r["output_tps"] for r in done),
        "latency_p50_s": med["latency_p50_s"],
        "latency_p99_s": med["latency_p99_s"],
        "cache_hit_rate": med["cache_hit_rate"],
        "failures": sum(r["failures"] for r in done),
        "same_text_as_reference": med["same_text_as_reference"],
        "reps": len(done),
    }


def paired_ratio(ref: list[float | None], other: list[float | None]) -> float | None:
    """Median over repetitions of ref[i] / other[i], over the repetitions where both ran
    (equal-length lists, one entry per repetition); None when none did."""
    ratios = [a / b for a, b in zip(ref, other) if a is not None and b]
    return statistics.median(ratios) if ratios else None


def _fmt(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if v is None else format(v * scale, spec)


def markdown_table(
    table: dict[str, dict[str, Any]],
    engines: list[str],
    ratios: dict[str, dict[str, float | None]],
    ngram_ratios: dict[str, dict[str, float | None]],
) -> str:
    """workload x engine rows: programs/s median (min-max), output tok/s, latency p50 /
    p99 (ms), cache hit rate, semantic failures, and radixlm's ratios over the row: plain
    radixlm's (`ratios[workload][engine]`) and radixlm with n-gram speculation's
    (`ngram_ratios`); blank where the row has none."""
    lines = [
        "| workload | engine | programs/s (min-max) | out tok/s | latency p50 / p99 ms "
        "| cache hit | failures | radixlm / engine | radixlm n-gram / engine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for wl, by_engine in table.items():
        for e in engines:
            row = by_engine.get(e)
            if not row or "status" in row:
                status = (row or {}).get("status", "not run")
                lines.append(f"| {wl} | {e} | {status} | | | | | | |")
                continue
            cells = []
            for by_wl in (ratios, ngram_ratios):
                r = by_wl.get(wl, {}).get(e)
                cells.append("" if r is None else f"{r:.2f}x")
            lines.append(
                f"| {wl} | {e} | {row['programs_per_s']:.3f} ({row['programs_per_s_min']:.3f}-"
                f"{row['programs_per_s_max']:.3f}) | {row['output_tps']:.1f} | "
                f"{_fmt(row['latency_p50_s'], '.0f', 1000)} / "
                f"{_fmt(row['latency_p99_s'], '.0f', 1000)} | "
                f"{_fmt(row['cache_hit_rate'], '.2f')} | {row['failures']} | {cells[0]} | "
                f"{cells[1]} |"
            )
    return "\n".join(lines)
