"""Multi-node tensor parallelism on one machine: two `radixlm serve` invocations as node
0 and node 1 (`--nnodes 2 --node-rank {0,1} --tp-size 2 --dist-init-addr` on loopback,
one rank each, tiny Llama on CPU over gloo). Node 0 serves HTTP and answers a greedy
request with --tp-size 1's tokens; node 1 serves nothing and exits 0 when node 0 shuts
the group down. An unreachable --dist-init-addr and settings that differ across the
nodes end start-up with an error naming the cause."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from radixlm import Engine
from radixlm.runtime.executor.parallel.group import free_port
from tests.frontend.conftest import start_server, stop_server
from tests.tiny_models import save_random_model, tiny_config

EXIT_TIMEOUT_S = 60
PROMPT = [5, 17, 300, 4000, 9, 11]
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    from radixlm.runtime import local_hf_dir

    path = tmp_path_factory.mktemp("llama")
    save_random_model(tiny_config("llama"), path, local_hf_dir("smollm2-135m"))
    return str(path)


def _node_args(model: str, node: int, port: int) -> list[str]:
    return [
        "--model", model, "--tp-size", "2", "--nnodes", "2", "--node-rank", str(node),
        "--dist-init-addr", f"127.0.0.1:{port}", "--max-total-tokens", "4096",
    ]  # fmt: skip


def _start_node1(model: str, port: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "radixlm", "serve", *_node_args(model, 1, port), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(node1: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = node1.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        node1.kill()
        _, err = node1.communicate()
    return node1.returncode, err


def test_two_nodes_on_loopback_answer_as_tp1(tiny_llama):
    with Engine(tiny_llama, max_total_tokens=4096) as e:
        want = e.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    port = free_port()
    node1 = _start_node1(tiny_llama, port)
    try:
        node0, url = start_server(*_node_args(tiny_llama, 0, port))
        try:
            assert httpx.get(f"{url}/get_server_info", timeout=30).json()["tp_size"] == 2
            body = {"input_ids": PROMPT, "sampling_params": GREEDY}
            out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
            assert out["output_ids"] == want
            node0.send_signal(signal.SIGTERM)
            assert node0.wait(EXIT_TIMEOUT_S) == 0, node0.log_tail()
        finally:
            stop_server(node0)
        code, err = _finish(node1)
        assert code == 0, err
    finally:
        node1.kill()


def test_unreachable_dist_init_addr_fails_within_the_timeout(tiny_llama):
    node1 = _start_node1(tiny_llama, free_port(), "--dist-timeout", "3")
    code, err = _finish(node1)
    assert code == 1
    assert "could not reach the group's address 127.0.0.1:" in err
    assert "within 3 s" in err


def test_settings_that_differ_across_nodes_are_refused(tiny_llama, tmp_path):
    from radixlm.runtime import local_hf_dir

    other = save_random_model(
        tiny_config("llama", intermediate_size=64), tmp_path, local_hf_dir("smollm2-135m")
    )
    del other
    port = free_port()
    node1 = _start_node1(str(tmp_path), port)
    try:
        with pytest.raises(RuntimeError, match="settings differ from rank 0's.*model config"):
            start_server(*_node_args(tiny_llama, 0, port))
        code, err = _finish(node1)
        assert code == 1
        assert "settings differ from rank 0's" in err
    finally:
        node1.kill()
