"""Writing a benchmark's JSON report (shared by the scripts in this folder)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def save_report(report: dict[str, Any], path: Path) -> None:
    """Write `report` as indented JSON to `path` (creating its folder) and say where on
    stderr; values JSON cannot encode are written as their str()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {path}", file=sys.stderr)
