"""ZMQ plumbing shared by the server processes: per-instance ipc:// endpoints and the
child-process setup (signals, parent-death watch, start-up handshake).

Each server instance keeps its socket files in a private ``radixlm-*`` directory under
the temporary directory, with its main process's pid in an ``owner.pid`` file. A server
killed with SIGKILL cannot remove its directory, so `IpcPaths.create` first removes the
directories whose owner is gone (`remove_stale_dirs`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from radixlm.errors import RadixLMError
from radixlm.runtime.server.messages import ProcessFailed, ProcessReady, encode

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PREFIX = "radixlm-"
_OWNER_FILE = "owner.pid"


@dataclass(frozen=True)
class IpcPaths:
    """The PULL endpoints of one server instance (each bound by its reader).

    tokenizer: read by the TokenizerManager (HTTP process); scheduler: read by the
    scheduler process (replica 0 with --dp-size > 1); detokenizer: read by the
    detokenizer process, which every replica sends to; extra_schedulers: read by
    replicas 1.. of a data-parallel server.
    """

    directory: str
    tokenizer: str
    scheduler: str
    detokenizer: str
    extra_schedulers: tuple[str, ...] = ()

    @property
    def schedulers(self) -> tuple[str, ...]:
        """Every replica's scheduler endpoint, by rank."""
        return (self.scheduler, *self.extra_schedulers)

    @classmethod
    def create(cls, num_schedulers: int = 1) -> IpcPaths:
        """Fresh endpoints for `num_schedulers` scheduler replicas in a new private temporary
        directory (unique per instance), owned by this process (its pid in ``owner.pid``);
        stale directories of dead servers are removed first."""
        remove_stale_dirs(tempfile.gettempdir())
        d = tempfile.mkdtemp(prefix=_PREFIX)
        # Written whole then renamed in, so a concurrent cleanup never reads half a pid.
        part = os.path.join(d, _OWNER_FILE + ".part")
        with open(part, "w") as f:
            f.write(str(os.getpid()))
        os.replace(part, os.path.join(d, _OWNER_FILE))
        extra = tuple(f"ipc://{d}/scheduler-{r}" for r in range(1, num_schedulers))
        return cls(
            d, f"ipc://{d}/tokenizer", f"ipc://{d}/scheduler", f"ipc://{d}/detokenizer", extra
        )

    def remove(self) -> None:
        """Delete the socket files' directory."""
        shutil.rmtree(self.directory, ignore_errors=True)


def remove_stale_dirs(root: str) -> list[str]:
    """Remove the socket directories in `root` left by servers whose process is gone.

    A directory is removed only when it is a real directory (not a link) named
    ``radixlm-*``, owned by this user, and holds an ``owner.pid`` naming a process that
    no longer exists. Anything else is kept: a live (or unknown-state) owner, a directory
    still being created (no pid file yet), one radixlm did not make. A reused pid keeps
    its directory (safe side). Returns the removed paths.
    """
    removed = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(_PREFIX) and _owner_gone(path):
            shutil.rmtree(path, ignore_errors=True)
            logger.info("removed the socket directory %s of a server that is gone", path)
            removed.append(path)
    return removed


def _owner_gone(path: str) -> bool:
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        with open(os.path.join(path, _OWNER_FILE)) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return False


def pull_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A PULL socket bound to `endpoint` (unbounded receive queue)."""
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(endpoint)
    return sock


def push_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A PUSH socket connected to `endpoint` (unbounded send queue, no linger on close)."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def run_child(name: str, log_level: str, status_conn, body: Callable[[Callable], None]) -> None:
    """Run a server child process's `body(ready)` with the process set up.

    The child ignores SIGINT (the parent orchestrates shutdown), dies with its parent
    (PR_SET_PDEATHSIG on Linux, plus a parent-pid watch), and reports over
    `status_conn` (a multiprocessing Connection): `ready(info)` sends ProcessReady; an
    exception sends ProcessFailed and exits with status 1: radixlm's own errors (a model
    it cannot load, a bad setting) as one line "Type: message", anything else with its
    traceback. The parent logs what it receives; the child logs only what it could not
    send.
    """
    logging.basicConfig(
        level=log_level.upper(),
        format=f"[%(asctime)s {name}] %(levelname)s %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()

    def ready(info: dict | None = None) -> None:
        status_conn.send_bytes(encode(ProcessReady(name, info or {})))

    try:
        body(ready)
    except Exception as exc:
        if isinstance(exc, RadixLMError):
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = traceback.format_exc()
        try:
            status_conn.send_bytes(encode(ProcessFailed(name, error)))
        except OSError:
            logger.error("%s process failed:\n%s", name, error)
        sys.stderr.flush()
        os._exit(1)


def _die_with_parent() -> None:
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
