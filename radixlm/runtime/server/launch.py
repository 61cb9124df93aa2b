"""The child processes of `radixlm serve`: the scheduler and the detokenizer.

`frontend/launch.py` starts them through `start_children`, serves HTTP while they live,
and stops them (`ChildProcess.stop`). Each child reports ready or failed on a pipe; children
die with their parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
from typing import Any

from radixlm.config import ServerArgs
from radixlm.runtime.executor.model_registry import local_hf_dir
from radixlm.runtime.server.detokenizer_process import run_detokenizer_process
from radixlm.runtime.server.heartbeat import scheduler_name
from radixlm.runtime.server.ipc import IpcPaths
from radixlm.runtime.server.messages import ProcessFailed, ProcessReady, decode
from radixlm.runtime.server.scheduler_process import run_scheduler_process
from radixlm.runtime.server.stack import load_tokenizer

logger = logging.getLogger(__name__)

#: Seconds a child gets to exit after SIGTERM before it is killed.
CHILD_GRACE_S = 5.0
_WATCH_INTERVAL_S = 0.2


class ChildFailed(RuntimeError):
    """A child process exited or reported an error (message: `ProcessFailed.error`)."""


class ChildProcess:
    """One child process and the pipe on which it reports ready / failed."""

    def __init__(self, ctx, name: str, target, args: ServerArgs, ipc: IpcPaths, extra: tuple = ()):
        self.name = name
        self.conn, child_conn = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=target, args=(args, ipc, child_conn, *extra), name=name)
        self.proc.start()
        child_conn.close()

    def failure(self) -> str | None:
        """The child's error if it reported one or exited, else None (never blocks)."""
        try:
            if self.conn.poll():
                msg = decode(self.conn.recv_bytes())
                if isinstance(msg, ProcessFailed):
                    return msg.error
        except (EOFError, OSError):
            pass
        if not self.proc.is_alive():
            return f"{self.name} process exited with code {self.proc.exitcode}"
        return None

    def wait_ready(self, stop_requested) -> dict[str, Any]:
        """Block until the child reports ready. Raises ChildFailed or KeyboardInterrupt."""
        while True:
            if stop_requested():
                raise KeyboardInterrupt
            if self.conn.poll(_WATCH_INTERVAL_S):
                try:
                    msg = decode(self.conn.recv_bytes())
                except (EOFError, OSError):
                    msg = None
                if isinstance(msg, ProcessReady):
                    return msg.info
                if isinstance(msg, ProcessFailed):
                    raise ChildFailed(msg.error)
            if not self.proc.is_alive():
                raise ChildFailed(f"{self.name} process exited with code {self.proc.exitcode}")

    def stop(self) -> None:
        """Terminate, then kill after the grace period."""
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(CHILD_GRACE_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Signals:
    """Records SIGINT/SIGTERM instead of dying, so shutdown can clean up children."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.server = None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, sig: int, frame) -> None:
        self.received.append(sig)
        if self.server is not None:
            self.server.should_exit = True

    def __call__(self) -> bool:
        return bool(self.received)


def start_children(
    args: ServerArgs, signals: Signals, children: list[ChildProcess]
) -> tuple[IpcPaths, dict[str, Any], Any]:
    """Start the scheduler processes (`args.dp_size` replicas, named ``scheduler`` or
    ``scheduler-R``) and the detokenizer process and wait until all are ready.

    A GGUF model is converted once here, before either child reads it; the tokenizer
    loads in this process while the children load the model. Each child is appended to
    `children` as it starts, so the caller stops them whatever happens.

    Returns (ipc paths, the model facts (replica 0's, with the smallest replica's
    max_total_tokens), the tokenizer).
    Raises ChildFailed when a child fails to start, KeyboardInterrupt on SIGINT/SIGTERM.
    """
    ipc = IpcPaths.create(args.dp_size)
    ctx = mp.get_context("spawn")
    try:
        local_hf_dir(args.model)
        schedulers = []
        for rank in range(args.dp_size):
            name = scheduler_name(rank, args.dp_size)
            child = ChildProcess(ctx, name, run_scheduler_process, args, ipc, (rank,))
            children.append(child)
            schedulers.append(child)
        detokenizer = ChildProcess(ctx, "detokenizer", run_detokenizer_process, args, ipc)
        children.append(detokenizer)
        tokenizer = load_tokenizer(args)
        all_facts = [child.wait_ready(signals) for child in schedulers]
        facts = {
            **all_facts[0],
            "max_total_tokens": min(f["max_total_tokens"] for f in all_facts),
        }
        detokenizer.wait_ready(signals)
    except BaseException:
        ipc.remove()
        raise
    return ipc, facts, tokenizer
