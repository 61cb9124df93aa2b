"""benchmarks/compare_engines.py's command line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from compare_engines import parse_args  # noqa: E402


def test_warm_shared_prefix_workload_needs_the_cold_one(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--workloads", "single,shared16-warm"])
    assert exc.value.code == 2
    assert "shared16-warm needs shared16-cold" in capsys.readouterr().err
    args = parse_args(["--workloads", "shared16-cold,shared16-warm", "--reps", "2"])
    assert args.workloads == "shared16-cold,shared16-warm" and args.reps == 2
    assert parse_args([]).workloads is None  # all workloads, cold before warm


def test_unknown_workload_and_engine_are_rejected(capsys):
    for flag in ("--workloads", "--engines"):
        with pytest.raises(SystemExit):
            parse_args([flag, "nope"])
        assert f"{flag}: unknown nope" in capsys.readouterr().err
