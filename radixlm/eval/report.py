"""The evaluation's output: one plain-text table (a row per metric, a column per
configuration) and the JSON document written by ``--out``."""

from __future__ import annotations

import math
from typing import Any

from radixlm.eval.runner import ConfigRun

#: Rows of the table in this order, then any other metric alphabetically.
_ORDER = (
    "weights_bytes",
    "kv_bytes_per_token",
    "greedy.agreement",
    "greedy.first_divergence_median",
    "teacher.kl_mean",
    "teacher.kl_max",
    "teacher.top1_agreement",
    "teacher.perplexity",
    "arith.accuracy",
    "kv-short.accuracy",
    "kv-long.accuracy",
    "json.json_valid_constrained",
    "json.json_valid_free",
)


def config_entry(run: ConfigRun, scores: dict[str, float], vs: dict | None) -> dict[str, Any]:
    """One configuration's JSON entry: name, flags, error, seconds, the sizes the server
    reports (bytes), its own scores and its comparison with the baseline (None for the
    baseline itself)."""
    return {
        "name": run.config.name,
        "flags": run.config.flags,
        "error": run.error,
        "seconds": round(run.seconds, 3),
        "weights_bytes": run.info.get("weights_bytes"),
        "kv_bytes_per_token": run.info.get("kv_bytes_per_token"),
        "attention_backend": (run.info.get("resolved") or {}).get("attention_backend"),
        "scores": scores,
        "vs_baseline": vs,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def flat_metrics(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry's table values: sizes, scores and the comparison summary in one dict."""
    flat = {k: entry[k] for k in ("weights_bytes", "kv_bytes_per_token")}
    flat.update(entry["scores"])
    flat.update((entry["vs_baseline"] or {}).get("summary", {}))
    return flat


def format_table(entries: list[dict[str, Any]]) -> str:
    """The table: a column per configuration (the baseline first), a row per metric; a
    configuration that failed shows its error under the table."""
    flats = [flat_metrics(e) for e in entries]
    keys = {k for f in flats for k in f}
    rows = [k for k in _ORDER if k in keys] + sorted(keys - set(_ORDER))
    header = ["metric"] + [e["name"] for e in entries]
    body = [[k] + [_cell(f.get(k)) for f in flats] for k in rows]
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

    lines = [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in body]
    lines += [f"{e['name']}: {e['error']}" for e in entries if e["error"]]
    return "\n".join(lines)
