"""The prefill worker's side of disaggregation (``--disaggregation-mode prefill``).

A request with bootstrap fields runs here with max_new_tokens 1 (its prompt's prefill and
its first token, as SGLang's prefill servers do). When it finishes, its prompt's KV is
copied out of the pool (`Scheduler.on_finished`, before the KV goes to this worker's
radix cache) and sent with the metadata to continue (`TransferMeta`) to the decode
worker named by the request. Its output is held until the transfer is done: then it goes
out as usual, or, if the transfer failed or was refused, the request fails with that
error (503 server_error). Requests without bootstrap fields run here from end to end.
"""

from __future__ import annotations

import logging
import time

import msgspec
import torch

from radixlm.config import ServerArgs
from radixlm.errors import InvalidRequestError, ServerError
from radixlm.runtime.disagg.kv_pages import gather, kv_layout
from radixlm.runtime.disagg.transport import GlooSender, KVSender, TransferError, TransferMeta
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.request import Req, ReqOutput
from radixlm.runtime.sched.scheduler import Scheduler
from radixlm.runtime.server.messages import DisaggParams, GenerateReq, ReqError

logger = logging.getLogger(__name__)


class PrefillSide:
    """Sends the prompt KV of the bootstrapped requests of one scheduler.

    Counters (for /get_server_info): transfers, bytes_sent, seconds_sent (time in
    `KVSender.send`), failures."""

    def __init__(self, args: ServerArgs, scheduler: Scheduler, pool):
        self.layout = kv_layout(args, pool)
        self.timeout = args.disaggregation_timeout
        self.scheduler = scheduler
        self.pool = pool
        self.senders: dict[tuple[str, int], KVSender] = {}
        self.targets: dict[str, DisaggParams] = {}
        self.ready: dict[str, tuple[TransferMeta, torch.Tensor]] = {}
        self.stats = {"transfers": 0, "bytes_sent": 0, "seconds_sent": 0.0, "failures": 0}
        scheduler.on_finished = self._capture

    def admit(self, msg: GenerateReq) -> GenerateReq:
        """The request to queue for `msg` (max_new_tokens 1) and remember its target.
        Raises InvalidRequestError without a decode address."""
        d = msg.disagg
        if d.bootstrap_host is None or d.bootstrap_port is None:
            raise InvalidRequestError(
                "a prefill worker needs bootstrap_host and bootstrap_port with bootstrap_room",
                param="bootstrap_host",
            )
        self.targets[msg.rid] = d
        params = msgspec.structs.replace(msg.params, max_new_tokens=1)
        return msgspec.structs.replace(msg, params=params)

    def _capture(self, req: Req) -> None:
        target = self.targets.get(req.rid)
        if target is None or not req.output_ids:
            return
        n = len(req.input_ids)
        kv = gather(self.pool, self.scheduler.table[req.row, :n].to(torch.int64))
        meta = TransferMeta(
            room=target.bootstrap_room,
            layout=self.layout,
            input_ids=list(req.input_ids),
            first_token=req.output_ids[0],
            seed=req.seed,
            kv_shape=list(kv.shape),
        )
        self.ready[req.rid] = (meta, kv)

    def settle(self, outputs: list[ReqOutput]) -> tuple[list[ReqOutput], list[ReqError]]:
        """Send the KV of the bootstrapped requests that finished in `outputs`; returns
        the outputs to ship and the errors of the requests whose transfer failed."""
        kept, errors = [], []
        for out in outputs:
            if out.finish_reason is None or out.rid not in self.targets:
                kept.append(out)
                continue
            target = self.targets.pop(out.rid)
            ready = self.ready.pop(out.rid, None)
            if out.finish_reason is FinishReason.ABORT or ready is None:
                kept.append(out)
                continue
            try:
                self._send(target, *ready)
            except TransferError as e:
                self.stats["failures"] += 1
                logger.warning("request %s: %s", out.rid, e)
                errors.append(ReqError.of(out.rid, ServerError(str(e))))
                continue
            kept.append(out)
        return kept, errors

    def _send(self, target: DisaggParams, meta: TransferMeta, kv: torch.Tensor) -> None:
        key = (target.bootstrap_host, target.bootstrap_port)
        sender = self.senders.get(key)
        if sender is None:
            sender = self.senders[key] = GlooSender(*key, self.timeout)
        start = time.perf_counter()
        sender.send(meta, kv)
        self.stats["seconds_sent"] += time.perf_counter() - start
        self.stats["transfers"] += 1
        self.stats["bytes_sent"] += kv.numel() * kv.element_size()

    def forget(self, rid: str) -> None:
        """Drop what is kept for `rid` (refused before it was queued)."""
        self.targets.pop(rid, None)
        self.ready.pop(rid, None)

    def info(self) -> dict:
        """The `disaggregation` entry of /get_server_info."""
        return {"mode": "prefill", "layout": msgspec.structs.asdict(self.layout), **self.stats}
