"""`radixlm serve`: start the scheduler and detokenizer processes, then the HTTP server.

Start-up: a GGUF model is converted once (here, before any child reads it); then the
scheduler process (loads the model) and the detokenizer process start together while this
process loads the tokenizer; when both report ready, uvicorn serves the FastAPI app and
the URL is printed once it accepts connections, so `/health` answers only when the model
is loaded.

Shutdown: SIGINT or SIGTERM stop uvicorn gracefully, then both children are terminated
(killed after a grace period); children also die with this process (PR_SET_PDEATHSIG).
If a child dies while serving, the server stops and exits with status 1 after logging
the child's error.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import signal
import sys
from typing import Any

from radixlm.config import ServerArgs
from radixlm.errors import RadixLMError
from radixlm.runtime.detokenizer_process import run_detokenizer_process
from radixlm.runtime.ipc import IpcPaths
from radixlm.runtime.loader import load_tokenizer
from radixlm.runtime.messages import ProcessFailed, ProcessReady, decode
from radixlm.runtime.model_registry import local_hf_dir
from radixlm.runtime.scheduler_process import run_scheduler_process

logger = logging.getLogger(__name__)

_CHILD_GRACE_S = 5.0
_WATCH_INTERVAL_S = 0.2


class ChildFailed(RuntimeError):
    """A child process exited or reported an error (message: its traceback)."""


class _Child:
    """One child process and the pipe on which it reports ready / failed."""

    def __init__(self, ctx, name: str, target, args: ServerArgs, ipc: IpcPaths):
        self.name = name
        self.conn, child_conn = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=target, args=(args, ipc, child_conn), name=name)
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
        self.proc.join(_CHILD_GRACE_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class _Signals:
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


def launch_server(args: ServerArgs) -> int:
    """Run the server until a signal or a child failure. Returns the exit status."""
    logging.basicConfig(
        level=args.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s"
    )
    signals = _Signals()
    signals.install()
    ipc = IpcPaths.create()
    ctx = mp.get_context("spawn")
    children: list[_Child] = []
    try:
        local_hf_dir(args.model)  # convert a GGUF once, here, before the children read it
        scheduler = _Child(ctx, "scheduler", run_scheduler_process, args, ipc)
        detokenizer = _Child(ctx, "detokenizer", run_detokenizer_process, args, ipc)
        children += [scheduler, detokenizer]
        tokenizer = load_tokenizer(args)  # while the children load
        facts = scheduler.wait_ready(signals)
        detokenizer.wait_ready(signals)
        return _serve(args, ipc, facts, tokenizer, children, signals)
    except ChildFailed as e:
        logger.error("server start-up failed:\n%s", e)
        return 1
    except RadixLMError as e:
        logger.error("server start-up failed: %s", e)
        return 1
    except KeyboardInterrupt:
        logger.info("interrupted during start-up")
        return 0
    finally:
        for child in children:
            child.stop()
        ipc.remove()


def _serve(args, ipc, facts, tokenizer, children: list[_Child], signals: _Signals) -> int:
    import uvicorn

    from radixlm.frontend.app import create_app
    from radixlm.runtime.tokenizer_manager import TokenizerManager

    tm = TokenizerManager(args, ipc, facts, tokenizer)
    app = create_app(tm, args)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        loop="none",
        lifespan="off",
        timeout_graceful_shutdown=_CHILD_GRACE_S,
    )
    server = uvicorn.Server(config)
    signals.server = server
    status = {"code": 0}

    async def watch() -> None:
        try:
            await _watch_until_exit()
        finally:  # end open streams now instead of after uvicorn's graceful timeout
            tm.fail_pending("the server is shutting down")

    async def _watch_until_exit() -> None:
        announced = False
        while not server.should_exit:
            if not announced and server.started:
                sys.stdout.write(f"radixlm serving on http://{args.host}:{_port(server)}\n")
                sys.stdout.flush()
                announced = True
            for child in children:
                error = child.failure()
                if error is not None:
                    logger.error("%s process died; stopping the server:\n%s", child.name, error)
                    status["code"] = 1
                    server.should_exit = True
                    return
            await asyncio.sleep(_WATCH_INTERVAL_S)

    async def main() -> None:
        await tm.start()
        watcher = asyncio.create_task(watch())
        try:
            if not signals():
                await server.serve()
        finally:
            watcher.cancel()
            await tm.close()

    _run(main())
    return status["code"]


def _port(server) -> int:
    """The bound port (differs from the configured one when that was 0)."""
    for s in getattr(server, "servers", []):
        for sock in s.sockets:
            return sock.getsockname()[1]
    return server.config.port


def _run(coro) -> None:
    """Run `coro` on uvloop when installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)
