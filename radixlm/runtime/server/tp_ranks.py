"""The tensor-parallel ranks beside rank 0: start, watch and stop them.

The process that builds the serving stack (the scheduler process, or the caller of an
in-process `Engine`) is rank 0. `TensorParallelRanks.start` checks the split, then spawns
ranks 1..N-1 (torch.multiprocessing's spawn context, one torch thread each by default)
and joins the torch.distributed group with them on a loopback port. Each rank builds its
own `ModelRunner` shard and then replays the steps rank 0 sends (`run_rank`) until the
shutdown step. The rank-to-rank transport is torch.distributed's (gloo on CPU, NCCL on
CUDA); the processes report ready or failed over a pipe, as the server's other children do.

Failure: a watchdog thread in rank 0 polls the ranks. When one dies, rank 0 learns which
(the message names the rank and its exit code or error): in the scheduler process
`on_failure` ends the process (the server then exits non-zero); in an `Engine` the next
(or the blocked) step raises RankFailedError. Ranks die with rank 0 (PR_SET_PDEATHSIG,
and a broken collective ends their step loop), so none is orphaned.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable

import torch
import torch.multiprocessing as mp

from radixlm.config import ServerArgs
from radixlm.errors import UnsupportedModelError
from radixlm.kernels import resolve_device
from radixlm.runtime.executor.layers.tensor_parallel import check_tensor_parallel
from radixlm.runtime.executor.model_registry import local_hf_dir, read_hf_config
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.executor.parallel import step_broadcast
from radixlm.runtime.executor.parallel.group import (
    RankFailedError,
    TPGroup,
    destroy_group,
    free_port,
    init_group,
)
from radixlm.runtime.server.ipc import run_child
from radixlm.runtime.server.messages import ProcessFailed, ProcessReady, decode

logger = logging.getLogger(__name__)

#: Seconds between the watchdog's checks that the ranks are alive.
_WATCH_S = 0.2
#: Seconds a rank gets to leave after the shutdown step before it is terminated.
_STOP_GRACE_S = 5.0
_ADDR = "127.0.0.1"


def check_args(args: ServerArgs, config) -> None:
    """Raise ValueError / UnsupportedModelError for settings `args.tp_size` cannot run
    with: a split of `config` that does not divide (`check_tensor_parallel`), more ranks
    than GPUs on CUDA, a drafter model (speculative decoding with tensor parallelism takes
    n-gram drafts only)."""
    n = args.tp_size
    check_tensor_parallel(config, n)
    if n == 1:
        return
    experts = next((getattr(config, f, None) for f in _EXPERTS if getattr(config, f, None)), 0)
    if args.ep_size > 1 and (not experts or experts % n):
        raise ValueError(
            f"--ep-size {args.ep_size} needs a mixture-of-experts model whose routed experts "
            f"divide by it (this model has {experts})"
        )
    device = resolve_device(args.device)
    local = n // args.nnodes
    if device.startswith("cuda") and local > torch.cuda.device_count():
        raise ValueError(
            f"--tp-size {n} needs {local} GPUs on each of {args.nnodes} node(s) (one per "
            f"rank); {torch.cuda.device_count()} visible"
        )
    if args.speculative_algorithm not in (None, "ngram"):
        raise UnsupportedModelError(
            f"--speculative-algorithm {args.speculative_algorithm} does not run with "
            "--tp-size > 1 (n-gram speculation does)"
        )


#: ServerArgs fields every node must share (they shape the shards, the KV pool and the
#: step broadcast's tables), compared at the rendezvous with the model's config.
_SHARED_ARGS = (
    "tp_size",
    "ep_size",
    "nnodes",
    "dtype",
    "kv_cache_dtype",
    "weight_format",
    "page_size",
    "max_running_requests",
    "context_length",
    "max_total_tokens",
    "mem_fraction",
)


_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")


def node_settings(args: ServerArgs, config) -> dict:
    """What every rank must agree on (`init_group`'s settings): `_SHARED_ARGS` and a
    digest of the model's config (its fields, without paths and versions)."""
    fields = {
        k: v
        for k, v in config.to_dict().items()
        if not k.startswith("_") and k not in ("name_or_path", "transformers_version")
    }
    text = json.dumps(fields, sort_keys=True, default=str)
    out = {k: getattr(args, k) for k in _SHARED_ARGS}
    out["model config"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


def rendezvous(args: ServerArgs) -> tuple[str, int]:
    """(host, port) where the ranks meet: --dist-init-addr, else a free loopback port."""
    if args.dist_init_addr is None:
        return _ADDR, free_port(_ADDR)
    host, _, port = args.dist_init_addr.rpartition(":")
    return host, int(port)


def node_ranks(args: ServerArgs) -> range:
    """The global ranks this node runs: tp_size / nnodes consecutive ones from
    node_rank * tp_size / nnodes."""
    per = args.tp_size // args.nnodes
    return range(args.node_rank * per, (args.node_rank + 1) * per)


class TensorParallelRanks:
    """Ranks 1..N-1 of a group whose rank 0 is this process (see the module docstring).

    Attributes:
        group: this process's `TPGroup` (rank 0).
    """

    def __init__(self, args: ServerArgs, config):
        self.args = args
        self.config = config
        self._on_failure: Callable[[str], None] | None = None
        self._failed: str | None = None
        self._stopping = threading.Event()
        addr, port = rendezvous(args)
        self._ranks = spawn_ranks(args, node_ranks(args)[1:], addr, port)
        self._watch = threading.Thread(target=self._watchdog, name="tp-watchdog", daemon=True)
        self._watch.start()
        try:
            self.group = self._join(resolve_device(args.device), addr, port)
        except BaseException:
            self._stopping.set()
            self._kill_all()
            raise
        self.group.failure = self.failure

    def _join(self, device: str, addr: str, port: int) -> TPGroup:
        """Join the group as rank 0. The join blocks until every rank has joined, so it
        runs on a helper thread while this one watches for a rank that died first (then
        RankFailedError names it)."""
        joined: list = []

        def join() -> None:
            try:
                settings = node_settings(self.args, self.config)
                joined.append(
                    init_group(
                        0,
                        self.args.tp_size,
                        device,
                        addr,
                        port,
                        settings=settings,
                        timeout_s=self.args.dist_timeout,
                    )
                )
            except RankFailedError as exc:
                joined.append(exc)

        thread = threading.Thread(target=join, name="tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(_WATCH_S)
            if self._failed is not None and thread.is_alive():
                raise RankFailedError(self._failed)
        if isinstance(joined[0], RankFailedError):
            raise joined[0]
        return joined[0]

    @classmethod
    def start(cls, args: ServerArgs, config) -> TensorParallelRanks:
        """Check the settings (`check_args`), start ranks 1..N-1 and join the group."""
        check_args(args, config)
        return cls(args, config)

    def set_on_failure(self, on_failure: Callable[[str], None] | None) -> None:
        """Call `on_failure(message)` from the watchdog when a rank dies from now on."""
        self._on_failure = on_failure

    def failure(self) -> str | None:
        """Why a rank failed ("tensor-parallel rank R exited with code C", with its
        reported error), or None while every rank runs."""
        return self._failed

    def wait_ready(self) -> None:
        """Block until every rank has built its shard. Raises RankFailedError naming a
        rank that failed first."""
        for rank, proc, conn in self._ranks:
            while not conn.poll(_WATCH_S):
                if self._failed is not None:
                    raise RankFailedError(self._failed)
            msg = decode(conn.recv_bytes())
            if not isinstance(msg, ProcessReady):
                self._note_failure(rank, proc, msg)
                raise RankFailedError(self._failed)

    def _watchdog(self) -> None:
        while not self._stopping.is_set():
            for rank, proc, _ in self._ranks:
                if not proc.is_alive() and not self._stopping.is_set():
                    self._note_failure(rank, proc, None)
                    self._kill_all()
                    logger.error("%s", self._failed)
                    if self._on_failure is not None:
                        self._on_failure(self._failed)
                    return
            self._stopping.wait(_WATCH_S)

    def _note_failure(self, rank: int, proc, msg) -> None:
        """Record rank `rank`'s failure, with the error it reported when it sent one."""
        if self._failed is not None:
            return
        proc.join(1.0)
        _, _, conn = next(r for r in self._ranks if r[0] == rank)
        try:
            if msg is None and conn.poll():
                msg = decode(conn.recv_bytes())
        except (EOFError, OSError):
            pass
        error = f": {msg.error.strip()}" if isinstance(msg, ProcessFailed) else ""
        code = proc.exitcode
        self._failed = f"tensor-parallel rank {rank} exited with code {code}{error}"

    def _kill_all(self) -> None:
        for _, proc, _ in self._ranks:
            if proc.is_alive():
                proc.kill()
        for _, proc, _ in self._ranks:
            proc.join(_STOP_GRACE_S)

    def abort(self) -> None:
        """Kill the ranks without the shutdown step (start-up failed: they may be inside
        another collective) and leave the group. Idempotent."""
        self._stopping.set()
        self._kill_all()
        destroy_group()

    def stop(self) -> None:
        """Send the shutdown step (when every rank still runs), wait for the ranks to
        leave (terminating any that do not) and leave the group. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._failed is None:
            try:
                step_broadcast.send_shutdown(self.group)
            except RuntimeError:
                logger.warning("tensor-parallel ranks did not take the shutdown step")
        for _, proc, _ in self._ranks:
            proc.join(_STOP_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        destroy_group()


def spawn_ranks(args: ServerArgs, ranks: range, addr: str, port: int) -> list[tuple]:
    """Start `run_rank` processes for `ranks` (spawn context, daemonic): a list of (rank,
    process, the read end of its status pipe)."""
    ctx = mp.get_context("spawn")
    out = []
    for rank in ranks:
        conn, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=run_rank, args=(args, rank, addr, port, child), name=f"tp-rank-{rank}"
        )
        proc.daemon = True
        proc.start()
        child.close()
        out.append((rank, proc, conn))
    return out


def run_rank(args: ServerArgs, rank: int, addr: str, port: int, status_conn) -> None:
    """Entry point of rank `rank` > 0 (multiprocessing target): join the group at
    addr:port, build this rank's shard, report ready, replay rank 0's steps until the
    shutdown step."""

    def body(ready) -> None:
        torch.set_num_threads(args.num_threads)
        hf_dir = local_hf_dir(args.model)
        config = read_hf_config(hf_dir)
        group = init_group(
            rank,
            args.tp_size,
            resolve_device(args.device),
            addr,
            port,
            local_rank=rank - node_ranks(args).start,
            settings=node_settings(args, config),
            timeout_s=args.dist_timeout,
        )
        runner = ModelRunner(args, hf_dir, config, group)
        ready()
        follow_steps(runner, group)
        destroy_group()

    run_child(f"tp-rank-{rank}", args.log_level, status_conn, body)


def follow_steps(runner: ModelRunner, group: TPGroup) -> None:
    """Replay rank 0's steps on this rank's shard until the shutdown step."""
    table = runner.req_to_token_pool.req_to_token
    while True:
        step = step_broadcast.receive(group, table)
        if step.op is step_broadcast.Op.SHUTDOWN:
            return
        if step.op is step_broadcast.Op.COPY_SLOTS:
            runner.copy_kv_slots(step.src, step.dst)
        else:
            runner.forward(step.fb)
