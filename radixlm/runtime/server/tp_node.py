"""A node other than node 0 of a multi-node tensor-parallel launch (`radixlm serve
--nnodes N --node-rank R --dist-init-addr HOST:PORT`, R > 0).

Such a node serves no HTTP and schedules nothing: it starts its tp_size / nnodes ranks
(`tp_ranks.run_rank`), which meet node 0's at --dist-init-addr, follow rank 0's steps and
leave at its shutdown step. The node exits when its ranks have: status 0 when every one
left at the shutdown step, 1 (naming the rank and its error) when one failed: the
rendezvous could not be reached, the nodes' settings differ, or the group broke.
"""

from __future__ import annotations

import logging
import time

from radixlm.config import ServerArgs
from radixlm.runtime.executor.model_registry import local_hf_dir, read_hf_config
from radixlm.runtime.server.messages import ProcessFailed, decode
from radixlm.runtime.server.tp_ranks import check_args, node_ranks, rendezvous, spawn_ranks

logger = logging.getLogger(__name__)

_POLL_S = 0.2


def run_node(args: ServerArgs) -> int:
    """Run this node's ranks until they end (module docstring); returns the exit status.
    Raises ValueError / UnsupportedModelError for settings the split cannot run with
    (`tp_ranks.check_args`)."""
    check_args(args, read_hf_config(local_hf_dir(args.model)))
    addr, port = rendezvous(args)
    ranks = spawn_ranks(args, node_ranks(args), addr, port)
    logger.info(
        "node %d of %d: tensor-parallel ranks %s meet at %s:%d",
        args.node_rank,
        args.nnodes,
        list(node_ranks(args)),
        addr,
        port,
    )
    try:
        while True:
            failed = [r for r in ranks if not r[1].is_alive() and r[1].exitcode != 0]
            if failed:
                logger.error("%s", _failure(*failed[0]))
                return 1
            if not any(proc.is_alive() for _, proc, _ in ranks):
                return 0
            time.sleep(_POLL_S)
    finally:
        for _, proc, _ in ranks:
            if proc.is_alive():
                proc.kill()
            proc.join()


def _failure(rank: int, proc, conn) -> str:
    """ "tensor-parallel rank R exited with code C", with the error the rank reported."""
    error = ""
    try:
        while conn.poll():
            msg = decode(conn.recv_bytes())
            if isinstance(msg, ProcessFailed):
                error = f": {msg.error.strip()}"
    except (EOFError, OSError):
        pass
    return f"tensor-parallel rank {rank} exited with code {proc.exitcode}{error}"
