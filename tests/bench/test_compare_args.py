"""benchmarks/compare_engines.py's command line and its ratio column."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from compare_engines import _ratio, parse_args, summarize_runs  # noqa: E402


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
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            busy = b"while True: pass" in f.read()
    except OSError:
        return False
    return busy and _child_of(pid, os.getpid())


def test_peers_run_with_their_own_openmp_defaults(monkeypatch):
    from peer_servers import ENGINES, engine_environ

    from radixlm import omp_policy

    by_key = {e.key: e for e in ENGINES}
    # As after `import radixlm` set its defaults here (or in a parent):
    for name, value in omp_policy.DEFAULTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(omp_policy.MARKER, "1")
    for key in ("radixlm", "radixlm-http"):
        env = engine_environ(by_key[key], 2)
        assert env["GOMP_SPINCOUNT"] == "1000" and env["OMP_NUM_THREADS"] == "2"
    for key in ("openvino", "vllm", "transformers"):
        env = engine_environ(by_key[key], 2, EXTRA="1")
        assert not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY", omp_policy.MARKER} & set(env)
        assert env["OMP_NUM_THREADS"] == "2" and env["EXTRA"] == "1"
    # A policy the user chose (no marker) reaches every engine.
    monkeypatch.delenv(omp_policy.MARKER)
    assert engine_environ(by_key["vllm"], 1)["GOMP_SPINCOUNT"] == "1000"


def test_busy_neighbours_die_with_a_killed_benchmark():
    import os
    import signal
    import subprocess
    import time

    here = Path(__file__).resolve().parents[2] / "benchmarks"
    code = (
        f"import sys, time; sys.path.insert(0, {str(here)!r})\n"
        "from machine import busy_neighbours\n"
        "with busy_neighbours(1):\n    print('up', flush=True); time.sleep(60)\n"
    )
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout.readline().strip() == "up"
        kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _child_of(int(p), bench.pid)]
        assert len(kids) == 1
        bench.send_signal(signal.SIGKILL)  # no finally block runs
        bench.wait()
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{kids[0]}/cmdline") and _alive(kids[0]):
            assert time.monotonic() < deadline, "the busy neighbour outlived its parent"
            time.sleep(0.05)
    finally:
        bench.kill()


def _child_of(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == parent
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """False once pid is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run(tps: float) -> dict:
    lat = {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
    return {"output_throughput": tps, "ttft_ms": lat, "tpot_ms": lat, "cache_hit_rate": None}


def test_ratio_pairs_the_repetitions():
    """radixlm / peer is the median of the per-repetition ratios: a machine that runs the
    whole third repetition at half speed leaves it at 2.00x, where the ratio of the
    medians (a fast radixlm rep over a slow peer rep) would read 4.00x."""
    radixlm = summarize_runs([_run(100), _run(40), _run(100)])
    peer = summarize_runs([_run(50), _run(20), _run(25)])
    assert radixlm["output_tps"] == [100, 40, 100]
    assert _ratio(radixlm, peer) == "2.00x"
    # Repetitions missing on one side (a peer that failed later): the medians' ratio.
    short = summarize_runs([_run(50), _run(20)])
    assert _ratio(radixlm, short) == f"{100 / 35:.2f}x"
    assert _ratio({}, peer) == ""
