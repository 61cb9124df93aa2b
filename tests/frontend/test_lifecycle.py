"""Server process lifecycle: start-up, signals, child failure, no orphans."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import psutil
import pytest

from tests.frontend.conftest import start_server, stop_server

EXIT_TIMEOUT_S = 60


def _children(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def _assert_gone(procs: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive, f"orphaned processes: {[(p.pid, p.name()) for p in alive]}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_every_process(sig):
    proc, url = start_server()
    try:
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        children = _children(proc)
        names = {c.pid for c in children}
        assert len(names) >= 2, "expected the scheduler and detokenizer processes"
        proc.send_signal(sig)
        assert proc.wait(EXIT_TIMEOUT_S) == 0, proc.log_tail()
        _assert_gone(children)
    finally:
        stop_server(proc)


def test_child_death_stops_server_with_error():
    proc, url = start_server()
    try:
        children = _children(proc)
        scheduler = max(children, key=lambda c: c.memory_info().rss)  # holds the model
        scheduler.kill()
        code = proc.wait(EXIT_TIMEOUT_S)
        assert code != 0
        assert "process died" in proc.log_tail(80)
        _assert_gone(children)
    finally:
        stop_server(proc)


def test_startup_failure_exits_nonzero():
    cmd = [sys.executable, "-m", "radixlm", "serve", "--model", "/nonexistent/model", "--port", "0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "/nonexistent/model" in result.stderr
    assert "radixlm serving on" not in result.stdout


def test_a_model_the_scheduler_cannot_load_is_one_error_line(tmp_path):
    """A checkpoint the scheduler process refuses (a missing tensor): the server exits 1
    with one line naming the error type and the tensor, and no traceback."""
    from safetensors.torch import load_file, save_file

    from radixlm.runtime import local_hf_dir
    from tests.tiny_models import save_family_model

    save_family_model("qwen3", tmp_path, local_hf_dir("smollm2-135m"))
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.self_attn.q_norm.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cmd = [sys.executable, "-m", "radixlm", "serve", "--model", str(tmp_path), "--port", "0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "server start-up failed: WeightsMismatchError: " in errors[0]
    assert "model.layers.1.self_attn.q_norm.weight" in errors[0]
    assert "Traceback" not in result.stderr
