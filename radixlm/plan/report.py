"""Planner output: a readable text report, or JSON with the raw numbers.

A `Report` carries the JSON payload (`data`, plain numbers in base units: bytes, seconds
or milliseconds as named, FLOP/s) and the human view (key/value facts, tables, notes)
built from the same numbers, so the two never disagree.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

_NUMERIC = re.compile(r"^-?[\d.,]+(\s?[%a-zA-Z]{0,3})?$")  # "1.2 GB", "45%", "1,024"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Any]]


@dataclass
class Report:
    title: str
    data: dict[str, Any]
    facts: list[tuple[str, Any]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fmt_bytes(n: float) -> str:
    """Decimal units (GB = 1e9 bytes), as GPU datasheets use."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n:.0f} B"


def fmt_num(x: Any, digits: int = 3) -> str:
    """Integers with thousands separators, floats with `digits` significant digits."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        if x == int(x) and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 10**digits:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def fmt_params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def render_table(table: Table) -> str:
    """Text columns left-aligned, numbers right-aligned (decided by the first row)."""
    cells = [[fmt_num(c) if not isinstance(c, str) else c for c in row] for row in table.rows]
    left = (
        [isinstance(c, str) and not _NUMERIC.match(c) for c in table.rows[0]] if table.rows else []
    )
    left += [False] * (len(table.headers) - len(left))
    widths = [len(h) for h in table.headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(row: list[str]) -> str:
        return "  ".join(
            (c.ljust(w) if lt else c.rjust(w)) for c, w, lt in zip(row, widths, left, strict=True)
        ).rstrip()

    lines = [table.title] if table.title else []
    lines.append(line(table.headers))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(line(row) for row in cells)
    return "\n".join(lines)


def render_text(report: Report) -> str:
    parts = [report.title, "=" * len(report.title)]
    if report.facts:
        width = max(len(k) for k, _ in report.facts)
        parts.extend(
            f"{k.ljust(width)}  {v if isinstance(v, str) else fmt_num(v)}" for k, v in report.facts
        )
    for table in report.tables:
        parts.extend(["", render_table(table)])
    if report.notes:
        parts.append("")
        parts.extend(f"* {n}" for n in report.notes)
    return "\n".join(parts) + "\n"


def _clean(obj: Any) -> Any:
    """JSON-safe copy: infinities and NaN become null."""
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def render_json(report: Report) -> str:
    return json.dumps(_clean({"command": report.title, **report.data}), indent=2) + "\n"
