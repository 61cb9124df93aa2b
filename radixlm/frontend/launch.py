"""`radixlm serve`: start the scheduler and detokenizer processes, then the HTTP server.

Start-up: a GGUF model is converted once (before any child reads it); then the
scheduler process (loads the model) and the detokenizer process start together while this
process loads the tokenizer (`runtime/server/launch.py`); when both report ready, uvicorn
serves the FastAPI app and the URL is printed once it accepts connections, so `/health`
answers only when the model is loaded.

Shutdown: SIGINT or SIGTERM stop uvicorn gracefully, then both children are terminated
(killed after a grace period); children also die with this process (PR_SET_PDEATHSIG).
If a child dies while serving, the server stops and exits with status 1 after logging
the child's error.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from radixlm.config import ServerArgs
from radixlm.errors import RadixLMError
from radixlm.runtime.server.launch import (
    CHILD_GRACE_S,
    ChildFailed,
    ChildProcess,
    Signals,
    start_children,
)
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

#: Seconds between checks that the children are alive while serving.
_WATCH_INTERVAL_S = 0.2


def launch_server(args: ServerArgs) -> int:
    """Run the server until a signal or a child failure. Returns the exit status."""
    logging.basicConfig(
        level=args.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s"
    )
    if args.node_rank > 0:
        return _run_other_node(args)
    signals = Signals()
    signals.install()
    children: list[ChildProcess] = []
    ipc = None
    try:
        ipc, facts, tokenizer = start_children(args, signals, children)
        return _serve(args, ipc, facts, tokenizer, children, signals)
    except ChildFailed as e:
        error = str(e)
        logger.error("server start-up failed:%s%s", "\n" if "\n" in error else " ", error)
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
        if ipc is not None:
            ipc.remove()


def _run_other_node(args: ServerArgs) -> int:
    """A node other than node 0 of a multi-node launch: its ranks only, no HTTP
    (`runtime.server.tp_node`)."""
    from radixlm.runtime.server.tp_node import run_node

    try:
        return run_node(args)
    except (RadixLMError, ValueError) as e:
        logger.error("node %d start-up failed: %s", args.node_rank, e)
        return 1
    except KeyboardInterrupt:
        return 0


def _serve(args, ipc, facts, tokenizer, children: list[ChildProcess], signals: Signals) -> int:
    import uvicorn

    from radixlm.frontend.app import create_app

    tm = TokenizerManager(args, ipc, facts, tokenizer)
    app = create_app(tm, args)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        loop="none",
        lifespan="off",
        timeout_graceful_shutdown=CHILD_GRACE_S,
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
