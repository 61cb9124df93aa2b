"""The scheduler replicas of a data-parallel server (`--dp-size N`), as the HTTP process
sees them: one PUSH socket per replica, the dispatch policy, the requests in flight on
each, and where each session lives.

Routing rules (the TokenizerManager applies them through `ReplicaSet`):

* A generate request goes where the policy (`dispatcher.py`) sends it, unless it is a
  turn of a session: a session's turns, and its close, go to the replica that opened it
  (its pinned sequence lives in that replica's radix cache). A session id this server did
  not open goes to ``crc32(id) % N``, whose scheduler refuses it as unknown.
* Aborts go to the replica that holds the request; an id no replica holds here is sent
  to every replica (an abort of an unknown id is a no-op there).
* Control requests (info, flush) go to every replica; `merge_infos` joins the answers.

The `/get_server_info` payload of a data-parallel server is replica 0's, with the
request and token counts of ``scheduler`` and ``memory`` summed over the replicas (the
hit rate and token usage recomputed from the sums; other ratios are replica 0's), plus
``dp_size`` and ``replicas``: per replica its ``dp_rank``,
``num_running``, ``num_waiting``, ``cache_hit_rate``, ``requests_routed`` (requests this
front end sent it since start) and its own ``scheduler``, ``memory`` and ``sessions``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import zmq

from radixlm.runtime.sched.sessions import SessionParams
from radixlm.runtime.server.dispatcher import DispatchPolicy
from radixlm.runtime.server.ipc import push_socket


class ReplicaSet:
    """Dispatch state over the replicas whose scheduler endpoints are `endpoints` (by rank).

    Attributes: policy (the DispatchPolicy), loads[r] (requests sent to replica r that
    have not finished), routed[r] (requests sent to replica r since start).
    """

    def __init__(self, endpoints: Sequence[str], policy: DispatchPolicy):
        if len(endpoints) != policy.num_replicas:
            raise ValueError(f"{len(endpoints)} endpoints for {policy.num_replicas} replicas")
        self.endpoints = tuple(endpoints)
        self.policy = policy
        self.loads = [0] * len(endpoints)
        self.routed = [0] * len(endpoints)
        self._ranks = tuple(range(len(endpoints)))
        self._sockets: list[zmq.Socket] = []
        self._rank_of: dict[str, int] = {}
        self._sessions: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.endpoints)

    def connect(self, ctx) -> None:
        """Open one PUSH socket per replica on `ctx` (a zmq or zmq.asyncio Context)."""
        self._sockets = [push_socket(ctx, e) for e in self.endpoints]

    @property
    def connected(self) -> bool:
        return bool(self._sockets)

    def socket(self, rank: int):
        """The socket to replica `rank`."""
        return self._sockets[rank]

    def sockets(self) -> list:
        """Every replica's socket, by rank."""
        return list(self._sockets)

    # ---- requests -------------------------------------------------------------------------

    def route(
        self,
        rid: str,
        input_ids: Sequence[int],
        extra_key: str | None = None,
        session: SessionParams | None = None,
    ) -> int:
        """Choose the replica of request `rid` and count it in flight there (until
        `release(rid)`). Returns its rank."""
        if session is not None:
            rank = self.session_rank(session.id)
        else:
            rank = self.policy.choose(input_ids, self._ranks, self.loads, extra_key)
        self._rank_of[rid] = rank
        self.loads[rank] += 1
        self.routed[rank] += 1
        return rank

    def rank_of(self, rid: str) -> int | None:
        """The replica holding in-flight request `rid` (None: not in flight here)."""
        return self._rank_of.get(rid)

    def release(self, rid: str) -> None:
        """Request `rid` ended (finished, refused or abandoned): no longer in flight."""
        rank = self._rank_of.pop(rid, None)
        if rank is not None:
            self.loads[rank] -= 1

    # ---- sessions ---------------------------------------------------------------------------

    def rank_for_new_session(self, session_id: str | None) -> int:
        """Where a session opens: the replica already holding `session_id` (which refuses
        the duplicate), else the least loaded one (ties: lowest rank)."""
        if session_id in self._sessions:
            return self._sessions[session_id]
        return min(self._ranks, key=lambda r: (self.loads[r], r))

    def bind_session(self, session_id: str, rank: int) -> None:
        self._sessions[session_id] = rank

    def unbind_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def session_rank(self, session_id: str) -> int:
        """The replica of `session_id` (module docstring for an id not opened here)."""
        rank = self._sessions.get(session_id)
        if rank is None:
            rank = zlib.crc32(session_id.encode()) % len(self.endpoints)
        return rank

    # ---- reports ------------------------------------------------------------------------------

    def merge_infos(self, infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """One `/get_server_info` payload from each replica's (by rank); module docstring."""
        replicas = [
            {
                "dp_rank": rank,
                "num_running": info["num_running"],
                "num_waiting": info["num_waiting"],
                "cache_hit_rate": info["scheduler"]["cache_hit_rate"],
                "requests_routed": self.routed[rank],
                "scheduler": info["scheduler"],
                "memory": info["memory"],
                "sessions": info["sessions"],
            }
            for rank, info in enumerate(infos)
        ]
        merged = dict(infos[0])
        if len(infos) > 1:
            merged["num_running"] = sum(i["num_running"] for i in infos)
            merged["num_waiting"] = sum(i["num_waiting"] for i in infos)
            merged["memory"] = _sum_counts([i["memory"] for i in infos])
            merged["scheduler"] = _merge_stats([i["scheduler"] for i in infos])
        return {**merged, "dp_size": len(infos), "replicas": replicas}


def _sum_counts(dicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """dicts[0] with every int value (a count) summed over `dicts`; ratios and settings
    stay replica 0's."""
    out = dict(dicts[0])
    for key, value in out.items():
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = sum(d.get(key, 0) for d in dicts)
    return out


def _merge_stats(stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Scheduler.stats() of the whole server: counts summed, hit rate and token usage
    recomputed from the sums (cached / prompt tokens; (total - free - evictable) / total)."""
    out = _sum_counts(stats)
    prompt = out.get("prompt_tokens_total", 0)
    out["cache_hit_rate"] = out.get("cached_tokens_total", 0) / prompt if prompt else 0.0
    total = out.get("total", 0)
    if total:
        out["token_usage"] = (total - out.get("free", 0) - out.get("evictable", 0)) / total
    return out
