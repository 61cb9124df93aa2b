"""Writing a benchmark's JSON report (shared by the scripts in this folder)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def save_report(report: dict[str, Any], path: Path) -> None:
    """Write `report` as indented JSON to `path` (creating its folder) and say where on
    stderr; values JSON cannot encode are written as their str()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def print_table_and_save(
    lines: list[str], path: Path, args: Any, load_before: tuple[float, ...], **data: Any
) -> None:
    """Print the markdown `lines` and save them with `args` (argparse namespace), the load
    average before the run and now, and `data` (`save_report`)."""
    markdown = "\n".join(lines)
    print(markdown)
    report = {"args": vars(args), "load_before": load_before, "load_after": os.getloadavg(),
              **data, "markdown": markdown}  # fmt: skip
    save_report(report, path)
