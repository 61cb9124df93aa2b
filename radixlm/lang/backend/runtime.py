"""`Runtime`: SGLang's `sgl.Runtime` for radixlm programs: start `radixlm serve` as a child
process on a free loopback port, program against it like a `RuntimeEndpoint`, shut it
down with `shutdown()` (or a `with` block, or at interpreter exit).

    runtime = rl.Runtime(model_path="smollm2-135m", max_total_tokens=8192)
    rl.set_default_backend(runtime)
    ...
    runtime.shutdown()

Keyword arguments other than the ones below become `radixlm serve` flags
(`max_total_tokens=8192` -> ``--max-total-tokens 8192``; True adds a bare flag, False and
None add nothing); SGLang's `model_path` is `--model`.
"""

from __future__ import annotations

import atexit
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from radixlm.errors import ServerError
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint

#: The line `radixlm serve` prints on stdout once it accepts requests.
READY = "radixlm serving on "
#: Seconds the server gets to exit after SIGTERM before it is killed.
STOP_GRACE_S = 30.0


def serve_flags(options: dict[str, Any]) -> list[str]:
    """`radixlm serve` flags of keyword options (see the module docstring)."""
    flags: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def ready_url(proc: subprocess.Popen, timeout: float) -> str:
    """The base URL a `radixlm serve` process (stdout a text pipe) prints once it accepts
    requests (`READY`). Its stdout is drained by a daemon thread, so the pipe never fills.
    Raises TimeoutError when it does not start in `timeout` seconds, ChildProcessError
    when it exits first (then waited for)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no '{READY.strip()}' line in {timeout} s") from None
        if line is None:
            proc.wait()
            raise ChildProcessError(f"the server exited with {proc.returncode}")
        if line.startswith(READY):
            return line[len(READY) :].strip()


class Runtime(RuntimeEndpoint):
    """A `radixlm serve` child process and the backend over it.

    Args:
        model_path: the model (alias, Hugging Face directory or .gguf), as SGLang names it.
        model: the same, by radixlm's name (one of the two).
        api_key: passed to the server (`--api-key`) and sent by the backend.
        start_timeout: seconds to wait for the server to accept requests.
        **server_args: further `radixlm serve` flags (`serve_flags`).

    Raises ServerError (with the server log's tail) when the server exits or does not
    start in time; ValueError without a model.
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        model: str | None = None,
        api_key: str | None = None,
        start_timeout: float = 600.0,
        **server_args: Any,
    ):
        model = model or model_path
        if not model:
            raise ValueError("Runtime needs a model (model_path= or model=)")
        options = {"host": "127.0.0.1", "port": 0, **server_args, "api_key": api_key}
        cmd = [sys.executable, "-m", "radixlm", "serve", "--model", model, *serve_flags(options)]
        self._log = Path(tempfile.mkstemp(prefix="radixlm-runtime-", suffix=".log")[1])
        with self._log.open("w") as log:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self._proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env
            )
        atexit.register(self.shutdown)
        url = self._wait_ready(start_timeout)
        super().__init__(url, api_key=api_key)

    @property
    def url(self) -> str:
        """The server's base URL (``http://127.0.0.1:PORT``)."""
        return self.base_url

    def _wait_ready(self, timeout: float) -> str:
        try:
            return ready_url(self._proc, timeout)
        except TimeoutError:
            self.shutdown()
            raise ServerError(
                f"the server did not start in {timeout} s:\n{self.log_tail()}"
            ) from None
        except ChildProcessError:
            raise ServerError(
                f"the server exited with {self._proc.returncode}:\n{self.log_tail()}"
            ) from None

    def log_tail(self, n: int = 20) -> str:
        """The last `n` lines of the server's log."""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-n:])

    def shutdown(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after `STOP_GRACE_S`); idempotent."""
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if hasattr(self, "_client"):
            super().shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
