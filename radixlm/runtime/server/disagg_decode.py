"""The decode worker's side of disaggregation (``--disaggregation-mode decode``).

A request with a bootstrap room waits here ("parked", holding no KV) until the prefill
worker's transfer for that room arrives (`GlooReceiver`, on background threads). The
transfer is checked against this worker's `KVLayout` on arrival: a different model or
layout is refused (the sender's request fails too) with a message naming the fields.
Then the request gets a row; its prompt's KV goes into the pool past the prefix this
worker already caches, and the prompt is inserted into the radix cache (so the next turn
of the conversation hits here) and locked for the request, which then continues from the
prefill's first token (`Scheduler.add_prefilled`) with the prefill's sampling seed.

A request whose KV does not arrive within --disaggregation-timeout seconds fails (503
server_error); KV that arrives for no request is dropped after as long.
"""

from __future__ import annotations

import logging
import queue
import time

import msgspec
import torch

from radixlm.config import ServerArgs
from radixlm.errors import InvalidRequestError, QueueFullError, RadixLMError, ServerError
from radixlm.runtime.disagg.kv_pages import kv_layout, scatter
from radixlm.runtime.disagg.transport import GlooReceiver, TransferMeta, kv_tensor
from radixlm.runtime.executor.memory import OutOfSlotsError
from radixlm.runtime.sampling.sampler import GRAMMAR_FIELDS
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.request import Req, ReqOutput
from radixlm.runtime.sched.scheduler import Scheduler
from radixlm.runtime.server.messages import GenerateReq, ReqError

logger = logging.getLogger(__name__)


class DecodeSide:
    """Receives prompt KV for the parked requests of one scheduler (module docstring).

    Raises (from the constructor) when the bootstrap port cannot be bound."""

    def __init__(self, args: ServerArgs, scheduler: Scheduler, pool):
        self.layout = kv_layout(args, pool)
        self.timeout = args.disaggregation_timeout
        self.scheduler = scheduler
        self.pool = pool
        self.parked: dict[int, tuple[GenerateReq, float]] = {}
        self.arrived: dict[int, tuple[TransferMeta, torch.Tensor | str, float]] = {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.stats = {"transfers": 0, "bytes_received": 0, "refused": 0, "timed_out": 0}
        self.receiver = GlooReceiver("0.0.0.0", args.disaggregation_bootstrap_port, self.timeout)
        self.receiver.start(self._on_transfer)

    def _on_transfer(self, meta: TransferMeta, raw: torch.Tensor) -> str | None:
        """(A receiver thread.) Accept a transfer of this layout, else refuse it; either
        way the room's request learns the outcome at the next `poll`."""
        reason = self.layout.mismatch(meta.layout)
        if reason is not None:
            reason = f"KV for a different model or layout: {reason}"
        else:
            try:
                kv: torch.Tensor | str = kv_tensor(meta, raw)
            except ValueError as e:
                reason = str(e)
        self._inbox.put((meta, reason if reason is not None else kv, time.monotonic()))
        return reason

    @property
    def waiting(self) -> bool:
        """Whether requests are parked (the loop then polls often)."""
        return bool(self.parked)

    def park(self, msg: GenerateReq) -> None:
        """Hold `msg` until its KV arrives. Raises InvalidRequestError for what a
        prefilled request cannot do here (logprobs, a grammar, a session) or a room
        already waiting."""
        p = msg.params
        if msg.logprobs.return_logprob or msg.session is not None or msg.pin_key is not None:
            raise InvalidRequestError(
                "disaggregated requests take no logprobs, sessions or stored responses",
                param="bootstrap_room",
            )
        if any(getattr(p, f) for f in GRAMMAR_FIELDS):
            raise InvalidRequestError(
                "disaggregated requests take no grammar", param="bootstrap_room"
            )
        room = msg.disagg.bootstrap_room
        if room in self.parked:
            raise InvalidRequestError(f"bootstrap_room {room} is already waiting", param="rid")
        self.parked[room] = (msg, time.monotonic())

    def abort(self, rid: str) -> ReqOutput | None:
        """Drop parked request `rid`; its abort event, or None when it is not parked."""
        for room, (msg, _) in self.parked.items():
            if msg.rid == rid:
                del self.parked[room]
                return ReqOutput(rid, [], FinishReason.ABORT, None, len(msg.input_ids), 0, 0)
        return None

    def poll(self) -> list[ReqError]:
        """Start the parked requests whose KV arrived; fail those refused or timed out.
        Returns their errors."""
        while not self._inbox.empty():
            meta, kv, at = self._inbox.get()
            self.arrived[meta.room] = (meta, kv, at)
        errors = []
        now = time.monotonic()
        for room in [r for r in self.parked if r in self.arrived]:
            msg, _ = self.parked.pop(room)
            meta, kv, _ = self.arrived.pop(room)
            try:
                if isinstance(kv, str):
                    self.stats["refused"] += 1
                    raise InvalidRequestError(kv, param="bootstrap_room")
                self._start(msg, meta, kv)
            except RadixLMError as e:
                errors.append(ReqError.of(msg.rid, e))
        for room, (msg, since) in list(self.parked.items()):
            if now - since > self.timeout:
                del self.parked[room]
                self.stats["timed_out"] += 1
                error = ServerError(
                    f"no KV arrived for bootstrap_room {room} within {self.timeout:g} s"
                )
                errors.append(ReqError.of(msg.rid, error))
        for room, (_, _, at) in list(self.arrived.items()):
            if now - at > self.timeout:
                del self.arrived[room]
        return errors

    def _start(self, msg: GenerateReq, meta: TransferMeta, kv: torch.Tensor) -> None:
        """Give the request its row and the received KV, cache its prompt, run it on.
        Raises InvalidRequestError (another prompt), RequestTooLargeError, QueueFullError
        (no row or slots free); nothing stays allocated then."""
        if meta.input_ids != msg.input_ids:
            raise InvalidRequestError(
                f"the KV for bootstrap_room {meta.room} is for another prompt "
                f"({len(meta.input_ids)} tokens, this request has {len(msg.input_ids)})",
                param="bootstrap_room",
            )
        sched = self.scheduler
        sched.check_fits(len(msg.input_ids), msg.params.max_new_tokens)
        if sched.req_pool.available() == 0:
            raise QueueFullError("no free request row for a prefilled request; retry later")
        req = Req.new(msg.rid, msg.input_ids, msg.params, extra_key=msg.extra_key)
        req.seed = meta.seed
        n = len(req.input_ids)
        match = sched.tree.match_prefix(req.input_ids, req.extra_key)
        sched.tree.lock(match.last_node)
        sched.kv.assign(req, match)
        start = req.prefix_len
        try:
            if n > start:
                slots = sched.kv.alloc(req, start, n - start)
                scatter(self.pool, slots, kv[:, start:n])
        except OutOfSlotsError as e:
            sched.kv.discard(req)
            raise QueueFullError(f"no KV slots for a prefilled request: {e}") from e
        req.kv_len = n
        sched.kv.cache_running(req)
        req.queue_time = time.perf_counter() - req.arrival_time
        req.cached_tokens = start
        self.stats["transfers"] += 1
        self.stats["bytes_received"] += kv.numel() * kv.element_size()
        sched.add_prefilled(req, meta.first_token)

    def info(self) -> dict:
        """The `disaggregation` entry of /get_server_info."""
        return {
            "mode": "decode",
            "bootstrap_port": self.receiver.port,
            "layout": msgspec.structs.asdict(self.layout),
            "parked": len(self.parked),
            **self.stats,
        }
