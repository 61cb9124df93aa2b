"""The tensor-parallel process group: N ranks joined by torch.distributed.

Backend: NCCL when the ranks run on CUDA (one GPU per rank, `cuda:<rank>`), gloo on the
CPU. The group is initialised over TCP (`tcp://addr:port`, loopback for one machine), so a
multi-node launch only changes the address and the rank numbering. Every collective the
model runs goes through `TPGroup`, so the layers never name torch.distributed.

References: Shoeybi et al. 2019 (Megatron-LM: column/row-parallel layers, one all-reduce
per block); PyTorch `torch.distributed` (init_process_group, all_reduce, gather, broadcast).
"""

from __future__ import annotations

import datetime
import socket
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


def init_group(rank: int, size: int, device: str, addr: str, port: int) -> TPGroup:
    """Join the group of `size` ranks meeting at tcp://addr:port as `rank`, on
    `rank_device(device, rank)` (selecting that GPU first on CUDA). Blocks until every rank
    has joined; raises RankFailedError when they have not within `JOIN_TIMEOUT_S`."""
    dev = rank_device(device, rank)
    if dev.startswith("cuda"):
        torch.cuda.set_device(torch.device(dev))
    try:
        dist.init_process_group(
            dist_backend_for(dev),
            init_method=f"tcp://{addr}:{port}",
            world_size=size,
            rank=rank,
            timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S),
        )
    except (RuntimeError, dist.DistStoreError) as exc:
        raise RankFailedError(
            f"tensor-parallel rank {rank} could not join the group at {addr}:{port}: {exc}"
        ) from None
    return TPGroup(rank, size, dev)


def destroy_group() -> None:
    """Leave the process group (no-op when none is initialised)."""
    if dist.is_initialized():
        dist.destroy_process_group()
