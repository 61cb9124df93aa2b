"""Fixtures for HTTP tests: a real `radixlm serve` on a free loopback port, clients, and
in-process Engine references for the same greedy requests.

`start_server(*extra_args)` / `stop_server(proc)` are reusable by other test modules
(lifecycle tests): the server runs as a subprocess with one compute thread and a small KV
pool; the URL comes from the line ``radixlm serving on http://HOST:PORT`` it prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from radixlm.lang.backend.runtime import ready_url

MODEL = "smollm2-135m"
SERVER_ARGS = ("--model", MODEL, "--port", "0", "--num-threads", "1", "--max-total-tokens", "20000")
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
API_KEY = "test-key"


class ServerProcess(subprocess.Popen):
    """A `radixlm serve` subprocess; `stderr_path` holds its log."""

    stderr_path: Path

    def log_tail(self, n: int = 40) -> str:
        lines = self.stderr_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def start_server(*extra_args: str, timeout: float = START_TIMEOUT_S) -> tuple[ServerProcess, str]:
    """Start `radixlm serve` (defaults: SERVER_ARGS, later flags override them).

    Returns (process, base URL like ``http://127.0.0.1:PORT``) once the server answers.
    Raises RuntimeError with the server log tail when it exits or does not start in time.
    """
    log = tempfile.NamedTemporaryFile(prefix="radixlm-serve-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "radixlm", "serve", *SERVER_ARGS, *extra_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = ServerProcess(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    proc.stderr_path = Path(log.name)
    try:
        return proc, ready_url(proc, timeout)
    except TimeoutError:
        stop_server(proc)
        raise RuntimeError(f"server did not start in {timeout} s:\n{proc.log_tail()}") from None
    except ChildProcessError:
        raise RuntimeError(f"server exited with {proc.returncode}:\n{proc.log_tail()}") from None


def stop_server(proc: subprocess.Popen) -> int:
    """SIGTERM, then wait (SIGKILL after STOP_TIMEOUT_S). Returns the exit status.

    The server log is deleted after a clean exit unless RADIXLM_KEEP_SERVER_LOG is set.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = getattr(proc, "stderr_path", None)
    if log is not None and proc.returncode == 0 and not os.environ.get("RADIXLM_KEEP_SERVER_LOG"):
        log.unlink(missing_ok=True)
    return proc.returncode


@contextmanager
def running_server(*extra_args: str) -> Iterator[str]:
    """A server started with `extra_args` for the block; yields its base URL and stops
    it on exit (see start_server/stop_server)."""
    proc, url = start_server(*extra_args)
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """Base URL of the shared server. It requires API_KEY, so every test also checks that
    a correct key is accepted (test_errors checks the refusals)."""
    with running_server("--api-key", API_KEY) as url:
        yield url


@pytest.fixture(scope="session")
def http(server) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server, timeout=120, headers=headers) as client:
        yield client


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from radixlm.runtime.executor.model_registry import local_hf_dir

    return AutoTokenizer.from_pretrained(local_hf_dir(MODEL))


# Greedy requests whose HTTP output must equal the in-process Engine's.
COMPLETION_PROMPT = "Once upon a time"
COMPLETION_MAX = 12
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
CHAT_MAX = 12


def chat_ids(tokenizer, messages) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


@pytest.fixture(scope="session")
def engine_ref(tokenizer) -> dict[str, dict]:
    """Engine results for the reference requests, computed once (then the engine is freed)."""
    import radixlm

    greedy = {"temperature": 0}
    with radixlm.Engine(model=MODEL, num_threads=1, max_total_tokens=4096) as engine:
        return {
            "completion": engine.generate(
                COMPLETION_PROMPT, {**greedy, "max_new_tokens": COMPLETION_MAX}
            ),
            "chat": engine.generate(
                input_ids=chat_ids(tokenizer, CHAT_MESSAGES),
                sampling_params={**greedy, "max_new_tokens": CHAT_MAX},
            ),
        }


def sse_payloads(lines) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream (an iterable of lines)."""
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def wait_idle(http: httpx.Client, timeout: float = 30.0) -> dict:
    """Poll /get_server_info until nothing runs, waits or holds KV; return the info.

    Raises AssertionError with the last counters after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        info = http.get("/get_server_info").json()
        if info["num_running"] == 0 and info["num_waiting"] == 0 and info["memory"]["held"] == 0:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"server still busy after {timeout} s: {info}")
        time.sleep(0.05)
