"""Per-request timings of a benchmark run and their summary (the numbers `radixlm bench`
reports).

Definitions follow SGLang's bench_serving and vLLM's benchmark_serving:
    TTFT  = send -> first streamed token (client clock)
    ITL   = gaps between successive streamed chunks that carry text
    TPOT  = (e2e - TTFT) / (output tokens - 1), per request with >= 2 output tokens
    e2e   = send -> end of stream
    goodput = requests whose TTFT <= SLO_ttft and TPOT <= SLO_tpot (a request with one
        output token has no TPOT and meets the TPOT SLO), as a fraction of completed
        requests and as a rate over the run's duration.
Percentiles use linear interpolation between order statistics (numpy's default), as
both reference clients do. Times are seconds in `RequestResult`, milliseconds in the
summary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """What the client measured for one request (seconds, tokens).

    prompt_tokens / output_tokens: from the server's usage when it reports them, else
    counted by the client. cached_tokens: prompt tokens the server reported as served
    from its prefix cache (None when the server does not report it).
    """

    success: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0
    text: str = ""

    @property
    def tpot(self) -> float | None:
        """(e2e - ttft) / (output_tokens - 1) in seconds; None with < 2 output tokens."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (text left out), with its tpot."""
        d = asdict(self)
        d.pop("text")
        d["tpot"] = self.tpot
        return d


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def distribution_ms(values_s: list[float]) -> dict[str, float | None]:
    """mean, p50, p90, p99 of `values_s` (seconds) in milliseconds (None when empty)."""
    if not values_s:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    out: dict[str, float | None] = {"mean": float(np.mean(values_s)) * 1000}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values_s, q) * 1000
    return out


def goodput(
    results: list[RequestResult],
    duration_s: float,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
) -> dict[str, Any]:
    """Requests meeting both SLOs (an SLO of None always holds): count, fraction of the
    successful requests, and rate in requests/s over `duration_s`."""
    ok = [r for r in results if r.success]
    good = 0
    for r in ok:
        ttft_ok = slo_ttft_ms is None or r.ttft * 1000 <= slo_ttft_ms
        tpot = r.tpot
        tpot_ok = slo_tpot_ms is None or tpot is None or tpot * 1000 <= slo_tpot_ms
        good += ttft_ok and tpot_ok
    return {
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
        "good_requests": good,
        "fraction": good / len(ok) if ok else 0.0,
        "rate_rps": good / duration_s if duration_s > 0 else 0.0,
    }


def cache_hit_rate(results: list[RequestResult]) -> float | None:
    """Sum of reported cached tokens / sum of prompt tokens over the requests whose
    server reported cached tokens; None when none did."""
    reported = [r for r in results if r.success and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    if not reported or prompt == 0:
        return None
    return sum(r.cached_tokens for r in reported) / prompt


def summarize(
    results: list[RequestResult],
    duration_s: float,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> dict[str, Any]:
    """The run's metrics (see the module docstring); throughputs use `duration_s`."""
    ok = [r for r in results if r.success]
    inp = sum(r.prompt_tokens for r in ok)
    out = sum(r.output_tokens for r in ok)
    dur = duration_s if duration_s > 0 else math.inf
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "input_tokens": inp,
        "output_tokens": out,
        "request_throughput": len(ok) / dur,
        "input_throughput": inp / dur,
        "output_throughput": out / dur,
        "ttft_ms": distribution_ms([r.ttft for r in ok]),
        "tpot_ms": distribution_ms(tpots),
        "itl_ms": distribution_ms([g for r in ok for g in r.itl]),
        "e2e_ms": distribution_ms([r.e2e for r in ok]),
        "cache_hit_rate": cache_hit_rate(ok),
        "goodput": goodput(ok, duration_s, slo_ttft_ms, slo_tpot_ms),
        "errors": sorted({r.error for r in results if not r.success})[:5],
        "error_counts": error_counts(results),
    }


def error_counts(results: list[RequestResult]) -> dict[str, int]:
    """Failed requests per distinct error message, most frequent first (ties in
    message order); a failure without a message counts as "unknown error"."""
    counts: dict[str, int] = {}
    for r in results:
        if not r.success:
            key = r.error or "unknown error"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def format_summary(s: dict[str, Any], title: str = "radixlm bench") -> str:
    """A fixed-width text table of a `summarize()` result."""
    rows: list[tuple[str, str]] = [
        ("Successful requests", f"{s['completed']}"),
        ("Failed requests", f"{s['failed']}"),
        ("Duration (s)", f"{s['duration_s']:.2f}"),
        ("Input tokens", f"{s['input_tokens']}"),
        ("Output tokens", f"{s['output_tokens']}"),
        ("Request throughput (req/s)", f"{s['request_throughput']:.3f}"),
        ("Input throughput (tok/s)", f"{s['input_throughput']:.2f}"),
        ("Output throughput (tok/s)", f"{s['output_throughput']:.2f}"),
    ]
    hit = s["cache_hit_rate"]
    rows.append(("Cache hit rate", "n/a" if hit is None else f"{hit:.3f}"))
    g = s["goodput"]
    slos = [
        f"{k}<={v:g} ms"
        for k, v in (("TTFT", g["slo_ttft_ms"]), ("TPOT", g["slo_tpot_ms"]))
        if v is not None
    ]
    rows.append(
        (
            f"Goodput ({', '.join(slos) or 'no SLO'})",
            f"{g['fraction']:.3f} ({g['rate_rps']:.3f} req/s)",
        )
    )
    for key, name in (
        ("ttft_ms", "TTFT"),
        ("tpot_ms", "TPOT"),
        ("itl_ms", "ITL"),
        ("e2e_ms", "E2E"),
    ):
        d = s[key]
        for stat in ("mean", "p50", "p90", "p99"):
            v = d[stat]
            rows.append((f"{name} {stat} (ms)", "n/a" if v is None else f"{v:.2f}"))
    width = max(len(k) for k, _ in rows) + 2
    line = "=" * (width + 16)
    body = "\n".join(f"{k:<{width}}{v:>16}" for k, v in rows)
    errors = "".join(f"\n{n:>6} x {msg}" for n, msg in _top_errors(s))
    if errors:
        errors = "\nFailed requests by error:" + errors
    return f"{line}\n{title:^{width + 16}}\n{line}\n{body}{errors}\n{line}"


def _top_errors(s: dict[str, Any], limit: int = 5) -> list[tuple[int, str]]:
    """(count, message) of a summary's most frequent errors; past `limit` lines, the
    last line counts the rest."""
    items = [(n, msg) for msg, n in s.get("error_counts", {}).items()]
    if len(items) > limit:
        rest = sum(n for n, _ in items[limit - 1 :])
        items = items[: limit - 1] + [(rest, f"{len(items) - limit + 1} other errors")]
    return items
