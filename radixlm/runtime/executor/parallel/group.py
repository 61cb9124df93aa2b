"""The tensor-parallel process group: N ranks joined by torch.distributed.

Backend: NCCL when the ranks run on CUDA (one GPU per rank, `cuda:<rank>`), gloo on the
CPU. The group meets at a TCP store that rank 0 hosts at addr:port (loopback for one
machine, node 0's --dist-init-addr across machines), where every rank first checks its
settings against rank 0's; a multi-node launch only changes the address and the rank
numbering. Every collective the
model runs goes through `TPGroup`, so the layers never name torch.distributed.

References: Shoeybi et al. 2019 (Megatron-LM: column/row-parallel layers, one all-reduce
per block); PyTorch `torch.distributed` (init_process_group, all_reduce, gather, broadcast).
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from radixlm.errors import ServerError

#: Seconds rank 0 waits for every rank to join the group at start-up.
JOIN_TIMEOUT_S = 120.0


class RankFailedError(ServerError):
    """A tensor-parallel rank died or failed; the message names the rank."""


def dist_backend_for(device: str) -> str:
    """torch.distributed backend for ranks on `device`: "nccl" on CUDA, "gloo" on CPU."""
    return "nccl" if str(device).startswith("cuda") else "gloo"


def rank_device(device: str, rank: int) -> str:
    """The device rank `rank` computes on: `cuda:<rank>` on CUDA (one GPU per rank), else
    `device` ("cpu")."""
    return f"cuda:{rank}" if str(device).startswith("cuda") else device


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it), for the group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class TPGroup:
    """This process's place in the tensor-parallel group and the collectives over it.

    Attributes:
        rank: this process's rank (0 schedules and samples). size: ranks in the group.
        device: the torch device this rank computes on.
        failure: returns why a peer rank failed (rank 0's watchdog sets it), else None.
    """

    rank: int
    size: int
    device: str
    failure: Callable[[], str | None] = field(default=lambda: None)

    @property
    def backend(self) -> str:
        return dist_backend_for(self.device)

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks in place (every rank gets the sum); returns `x`."""
        dist.all_reduce(x)
        return x

    def gather_to_first(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `x` (same shape and dtype on all ranks), in rank order, on rank 0;
        None on the other ranks."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0)
        return parts

    def broadcast_(self, x: torch.Tensor) -> torch.Tensor:
        """Overwrite `x` on every rank with rank 0's `x` (same shape on all ranks)."""
        dist.broadcast(x, src=0)
        return x

    def min_int(self, value: int) -> int:
        """The smallest of every rank's `value`."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


def init_group(
    rank: int,
    size: int,
    device: str,
    addr: str,
    port: int,
    *,
    local_rank: int | None = None,
    settings: dict | None = None,
    timeout_s: float = JOIN_TIMEOUT_S,
) -> TPGroup:
    """Join the group of `size` ranks meeting at addr:port as `rank`, computing on
    `rank_device(device, local_rank)` (the rank's index on its own machine, default
    `rank`; that GPU is selected first on CUDA). Rank 0 hosts the rendezvous store.

    `settings` (JSON-serialisable, the same on every rank of a consistent launch) are
    compared with rank 0's before the group forms (`_agree`). Blocks until every rank has
    joined. Raises RankFailedError when addr:port cannot be reached, the settings differ
    (naming the keys), or the ranks have not all joined within `timeout_s` seconds."""
    dev = rank_device(device, rank if local_rank is None else local_rank)
    if dev.startswith("cuda"):
        torch.cuda.set_device(torch.device(dev))
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(
            addr, port, is_master=rank == 0, timeout=timeout, wait_for_workers=False
        )
    except (RuntimeError, dist.DistStoreError) as exc:
        raise RankFailedError(
            f"tensor-parallel rank {rank} could not reach the group's address {addr}:{port} "
            f"within {timeout_s:g} s (--dist-init-addr, --dist-timeout): {exc}"
        ) from None
    if settings is not None:
        _agree(store, rank, size, settings, timeout_s)
    try:
        dist.init_process_group(
            dist_backend_for(dev), store=store, world_size=size, rank=rank, timeout=timeout
        )
    except (RuntimeError, dist.DistStoreError) as exc:
        raise RankFailedError(
            f"tensor-parallel rank {rank} could not join the group at {addr}:{port}: {exc}"
        ) from None
    return TPGroup(rank, size, dev)


_SETTINGS = "radixlm/settings/0"
_MISMATCH = "radixlm/mismatch"
_AGREED = "radixlm/agreed"


def _agree(store, rank: int, size: int, settings: dict, timeout_s: float) -> None:
    """Check every rank's `settings` against rank 0's through the rendezvous store, before
    any collective: a rank > 0 compares and records a mismatch; rank 0 waits until the
    other size - 1 ranks have agreed or one has recorded a mismatch. Raises
    RankFailedError naming the differing keys (on rank 0 and on the differing rank)."""
    mine = json.dumps(settings, sort_keys=True)
    if rank == 0:
        store.set(_SETTINGS, mine)
        deadline = time.monotonic() + timeout_s
        while store.add(_AGREED, 0) < size - 1:
            if store.check([_MISMATCH]):
                raise RankFailedError(store.get(_MISMATCH).decode())
            if time.monotonic() > deadline:
                raise RankFailedError(
                    f"tensor-parallel rank 0: only {store.add(_AGREED, 0)} of the other "
                    f"{size - 1} ranks joined within {timeout_s:g} s (--dist-timeout)"
                )
            time.sleep(0.05)
        return
    first = json.loads(store.get(_SETTINGS))
    differ = sorted(k for k in first.keys() | settings.keys() if first.get(k) != settings.get(k))
    if differ:
        pairs = ", ".join(f"{k}: {settings.get(k)!r} vs {first.get(k)!r}" for k in differ)
        message = (
            f"tensor-parallel rank {rank}'s settings differ from rank 0's (node 0): {pairs}; "
            "start every node with the same model and parallel settings"
        )
        store.set(_MISMATCH, message)
        raise RankFailedError(message)
    store.add(_AGREED, 1)


def destroy_group() -> None:
    """Leave the process group (no-op when none is initialised)."""
    if dist.is_initialized():
        dist.destroy_process_group()
