"""Request-rate sweeps: the throughput-latency curve, its knee and the SLO operating point.

Definitions (on the points of one sweep, in increasing request rate):
    knee: the last point whose p99 latency is at most `knee_factor` (2) times the p99
        latency at the lowest rate; past it, more offered load mostly buys queueing.
        Computed separately for TPOT p99 and TTFT p99. If every point stays within the
        factor, the knee is the last point (the sweep did not reach saturation).
    operating point: among the points whose TTFT p99 <= --slo-ttft-ms and TPOT p99 <=
        --slo-tpot-ms, the one with the highest output tokens/s (None without SLOs or
        when no point meets them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

KNEE_FACTOR = 2.0


def parse_rates(text: str) -> list[float]:
    """'1,2,4,inf' -> [1.0, 2.0, 4.0, inf]. Raises ValueError for an empty list, a
    value that is not a number, or a rate that is not > 0 (nan included)."""
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or not all(r > 0 for r in rates):
        raise ValueError(f"--sweep-rate needs positive rates separated by commas, got {text!r}")
    return sorted(rates)


def knee_index(latencies: list[float | None], factor: float = KNEE_FACTOR) -> int | None:
    """Index of the knee (see the module docstring); None when no latency is known."""
    known = [(i, v) for i, v in enumerate(latencies) if v is not None]
    if not known:
        return None
    base = known[0][1]
    knee = known[0][0]
    for i, v in known[1:]:
        if v > factor * base:
            break
        knee = i
    return knee


def operating_point(
    points: list[dict[str, Any]], slo_ttft_ms: float | None, slo_tpot_ms: float | None
) -> int | None:
    """Index of the highest-throughput point meeting both p99 SLOs (see above)."""
    if slo_ttft_ms is None and slo_tpot_ms is None:
        return None
    best = None
    for i, p in enumerate(points):
        ttft, tpot = p["ttft_ms"]["p99"], p["tpot_ms"]["p99"]
        if slo_ttft_ms is not None and (ttft is None or ttft > slo_ttft_ms):
            continue
        if slo_tpot_ms is not None and tpot is not None and tpot > slo_tpot_ms:
            continue
        if best is None or p["output_throughput"] > points[best]["output_throughput"]:
            best = i
    return best


def analyze(
    points: list[dict[str, Any]], slo_ttft_ms: float | None, slo_tpot_ms: float | None
) -> dict[str, Any]:
    """Knees (by TPOT p99 and TTFT p99) and the operating point, as indices and rates."""

    def rate(i: int | None) -> float | None:
        return None if i is None else points[i]["request_rate"]

    k_tpot = knee_index([p["tpot_ms"]["p99"] for p in points])
    k_ttft = knee_index([p["ttft_ms"]["p99"] for p in points])
    op = operating_point(points, slo_ttft_ms, slo_tpot_ms)
    return {
        "knee_factor": KNEE_FACTOR,
        "knee_tpot_index": k_tpot,
        "knee_tpot_rate": rate(k_tpot),
        "knee_ttft_index": k_ttft,
        "knee_ttft_rate": rate(k_ttft),
        "operating_index": op,
        "operating_rate": rate(op),
        "operating_output_throughput": None if op is None else points[op]["output_throughput"],
    }


def plot_sweep(
    points: list[dict[str, Any]],
    analysis: dict[str, Any],
    path: str | Path,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    title: str = "radixlm bench sweep",
) -> Path:
    """Draw output tokens/s against TPOT p99 and TTFT p99 (ms) to a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = (
        ("tpot_ms", "TPOT p99 (ms)", analysis["knee_tpot_index"], slo_tpot_ms),
        ("ttft_ms", "TTFT p99 (ms)", analysis["knee_ttft_index"], slo_ttft_ms),
    )
    op = analysis["operating_index"]
    for ax, (key, label, knee, slo) in zip(axes, panels):
        pts = [(p[key]["p99"], p["output_throughput"], p["request_rate"]) for p in points]
        pts = [(x, y, r) for x, y, r in pts if x is not None]
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o-", color="tab:blue")
        for x, y, r in pts:
            ax.annotate(f"{r:g}/s", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
        if knee is not None and points[knee][key]["p99"] is not None:
            ax.plot(
                points[knee][key]["p99"],
                points[knee]["output_throughput"],
                "o",
                ms=14,
                mfc="none",
                mec="tab:red",
                mew=2,
                label="knee (p99 <= 2x low load)",
            )
        if op is not None and points[op][key]["p99"] is not None:
            ax.plot(
                points[op][key]["p99"],
                points[op]["output_throughput"],
                "*",
                ms=16,
                color="tab:green",
                label="operating point (SLOs met)",
            )
        if slo is not None:
            ax.axvline(slo, ls="--", color="gray", label=f"SLO {slo:g} ms")
        ax.set_xlabel(label)
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
