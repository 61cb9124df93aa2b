"""`radixlm serve --tp-size 2` as a subprocess (tiny Llama, CPU ranks over gloo): start-up
reports the split, SIGTERM stops every process including the rank, and a rank's death
stops the server with a non-zero status naming the rank, ends the in-flight request and
leaves no process behind."""

from __future__ import annotations

import signal
import threading

import httpx
import psutil
import pytest

from tests.frontend.conftest import start_server, stop_server
from tests.tiny_models import save_random_model, tiny_config

EXIT_TIMEOUT_S = 60
TP_ARGS = ("--tp-size", "2", "--max-total-tokens", "4096")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    from radixlm.runtime import local_hf_dir

    path = tmp_path_factory.mktemp("llama")
    save_random_model(tiny_config("llama"), path, local_hf_dir("smollm2-135m"))
    return str(path)


def _tree(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _rank1(pid: int) -> psutil.Process:
    """Rank 1: the scheduler process's (rank 0's) spawned child (its other child is
    multiprocessing's resource tracker)."""
    (child,) = [p for p in psutil.Process(pid).children() if p.children()]
    (rank,) = [p for p in child.children() if "spawn_main" in " ".join(p.cmdline())]
    return rank


def _assert_gone(procs: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive, f"orphaned processes: {[(p.pid, p.name()) for p in alive]}"


def test_serves_split_and_stops_every_rank(tiny_llama):
    proc, url = start_server("--model", tiny_llama, *TP_ARGS)
    try:
        info = httpx.get(f"{url}/get_server_info", timeout=30).json()
        assert info["tp_size"] == 2
        # 2 layers x 1 KV head of 16 dims x K and V x 4 bytes on each rank
        assert info["kv_bytes_per_token"] == 256
        assert info["kv_bytes_per_token_all_ranks"] == 512
        body = {"input_ids": [5, 17, 300], "sampling_params": {"max_new_tokens": 4}}
        out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
        assert len(out["output_ids"]) == 4
        procs = _tree(proc.pid)
        assert _rank1(proc.pid) in procs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_TIMEOUT_S) == 0, proc.log_tail()
        _assert_gone(procs)
    finally:
        stop_server(proc)


def test_rank_death_stops_server_naming_the_rank(tiny_llama):
    proc, url = start_server("--model", tiny_llama, *TP_ARGS)
    try:
        procs = _tree(proc.pid)
        result: dict = {}

        def long_request() -> None:
            body = {
                "input_ids": [5, 17, 300],
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
            }
            try:
                result["status"] = httpx.post(f"{url}/generate", json=body, timeout=120).status_code
            except httpx.HTTPError as exc:
                result["error"] = type(exc).__name__

        client = threading.Thread(target=long_request)
        client.start()
        _rank1(proc.pid).kill()
        code = proc.wait(EXIT_TIMEOUT_S)
        client.join(EXIT_TIMEOUT_S)
        assert code != 0
        assert "tensor-parallel rank 1 exited with code -9" in proc.log_tail(80)
        assert not client.is_alive(), "the in-flight request hung"
        assert result.get("status", 503) != 200
        _assert_gone(procs)
    finally:
        stop_server(proc)
