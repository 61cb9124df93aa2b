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


def test_neighbours_default_to_none_and_must_not_be_negative(capsys):
    assert parse_args([]).neighbours == 0
    assert parse_args(["--neighbours", "2"]).neighbours == 2
    with pytest.raises(SystemExit) as exc:
        parse_args(["--neighbours", "-1"])
    assert exc.value.code == 2
    assert "--neighbours must be at least 0" in capsys.readouterr().err


def test_busy_neighbours_run_in_their_own_sessions_and_are_stopped():
    import os

    from machine import busy_neighbours

    with busy_neighbours(2):
        me = os.getsid(0)
        kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _busy_child(int(p))]
        assert len(kids) == 2
        assert all(os.getsid(k) != me for k in kids)
        assert all(os.getpriority(os.PRIO_PROCESS, k) == 19 for k in kids)
    assert all(not os.path.exists(f"/proc/{k}") for k in kids)


def _busy_child(pid: int) -> bool:
    """Whether pid is a child of this process running the busy loop."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            busy = b"while True: pass" in f.read()
    except OSError:
        return False
    return parent == os.getpid() and busy


def test_peers_run_with_their_own_openmp_defaults(monkeypatch):
    from peer_servers import ENGINES, engine_environ

    from radixlm import omp_policy

    by_key = {e.key: e for e in ENGINES}
    # As after `import radixlm` set its defaults in this process:
    monkeypatch.setattr(omp_policy, "_state", "passive (..., set by radixlm)")
    for name, value in omp_policy.DEFAULTS.items():
        monkeypatch.setenv(name, value)
    for key in ("radixlm", "radixlm-http"):
        env = engine_environ(by_key[key], 2)
        assert env["GOMP_SPINCOUNT"] == "300" and env["OMP_NUM_THREADS"] == "2"
    for key in ("openvino", "vllm", "transformers"):
        env = engine_environ(by_key[key], 2, EXTRA="1")
        assert "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env
        assert env["OMP_NUM_THREADS"] == "2" and env["EXTRA"] == "1"
    # A policy the user chose reaches every engine.
    monkeypatch.setattr(omp_policy, "_state", "spin (GOMP_SPINCOUNT=300)")
    assert engine_environ(by_key["vllm"], 1)["GOMP_SPINCOUNT"] == "300"
