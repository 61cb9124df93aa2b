"""`radixlm router`: admit the workers, then serve the router app until SIGINT/SIGTERM.

Prints ``radixlm serving on http://HOST:PORT`` once it accepts connections (the line
`radixlm serve` prints, so the same clients and tests find it). A worker URL that is not
a radixlm worker, or does not answer within --worker-startup-timeout, ends the start
with status 1 and a message naming it (`router_pool.WorkerRefused`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import httpx

from radixlm.frontend.launch import _port, _run
from radixlm.frontend.router_pool import WorkerPool, WorkerRefused
from radixlm.runtime.server.dispatcher import POLICIES, make_policy

logger = logging.getLogger(__name__)


def add_router_args(parser: argparse.ArgumentParser) -> None:
    """The flags of `radixlm router`."""
    parser.add_argument(
        "--worker-urls", nargs="+", metavar="URL",
        help="base URLs of the `radixlm serve` workers, e.g. http://10.0.0.2:30000",
    )  # fmt: skip
    parser.add_argument(
        "--prefill-urls", nargs="+", metavar="URL",
        help="prefill/decode mode (with --decode-urls, instead of --worker-urls): the "
        "`radixlm serve --disaggregation-mode prefill` workers",
    )  # fmt: skip
    parser.add_argument(
        "--decode-urls", nargs="+", metavar="URL",
        help="prefill/decode mode: the `radixlm serve --disaggregation-mode decode` workers",
    )  # fmt: skip
    parser.add_argument(
        "--policy", choices=POLICIES, default=POLICIES[0],
        help="routing policy: the worker whose requests share the longest prefix with this "
        "one unless loads are imbalanced (cache_aware), in turn, or the fewest in flight "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="(default: %(default)s)")
    parser.add_argument(
        "--port", type=int, default=30080, help="0: any free port (default: %(default)s)"
    )
    parser.add_argument(
        "--balance-threshold", type=int, default=4,
        help="cache_aware: requests in flight by which the busiest worker may exceed the "
        "idlest before routing ignores prefixes (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--health-interval", type=float, default=2.0,
        help="seconds between health checks of each worker (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--worker-startup-timeout", type=float, default=60.0,
        help="seconds to wait at start for a worker that does not answer yet "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info", help="(default: %(default)s)")


def run_router(args: argparse.Namespace) -> int:
    """Run the router until a signal. Returns the exit status (1: a worker was refused)."""
    import uvicorn

    from radixlm.frontend.router_app import create_router_app
    from radixlm.frontend.router_pd import check_roles, create_pd_router_app

    logging.basicConfig(
        level=args.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe
    if args.health_interval <= 0 or args.balance_threshold < 0:
        logger.error("--health-interval must be > 0 and --balance-threshold >= 0")
        return 1
    pd = args.prefill_urls is not None or args.decode_urls is not None
    if pd == (args.worker_urls is not None) or (
        pd and not (args.prefill_urls and args.decode_urls)
    ):
        logger.error("give --worker-urls, or --prefill-urls and --decode-urls")
        return 1
    status = {"code": 0}

    async def main() -> None:
        timeout = httpx.Timeout(connect=5.0, read=None, write=30.0, pool=None)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            url_lists = [args.prefill_urls, args.decode_urls] if pd else [args.worker_urls]
            pools = [
                WorkerPool(
                    urls,
                    make_policy(args.policy, len(urls), balance_threshold=args.balance_threshold),
                    client,
                    health_interval=args.health_interval,
                )
                for urls in url_lists
            ]
            try:
                for pool in pools:
                    await pool.admit_all(args.worker_startup_timeout)
                ports = await check_roles(*pools) if pd else None
            except WorkerRefused as e:
                logger.error("router start-up failed: %s", e)
                status["code"] = 1
                return
            app = create_pd_router_app(*pools, ports) if pd else create_router_app(pools[0])
            config = uvicorn.Config(
                app, host=args.host, port=args.port,
                log_level=args.log_level, loop="none", lifespan="off",
            )  # fmt: skip
            server = uvicorn.Server(config)
            health = [asyncio.create_task(pool.health_loop()) for pool in pools]
            announce = asyncio.create_task(_announce(server, args.host))
            try:
                await server.serve()
            finally:
                for task in health:
                    task.cancel()
                announce.cancel()

    _run(main())
    return status["code"]


async def _announce(server, host: str) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    sys.stdout.write(f"radixlm serving on http://{host}:{_port(server)}\n")
    sys.stdout.flush()
