"""Request intake: the checks and bookkeeping a new request passes before it is queued.

`Scheduler.add_request` hands each request to `Intake.accept`: a session turn's prompt is
composed (`sessions.py`), the request must fit the KV pool and the context, the waiting
queue must have room, the SLO controller may refuse it (`slo.py`), its grammar starts
compiling, it gets its sampling seed, and its session is registered. The scheduler then
appends it to `waiting`, or to `compiling` while its grammar compiles on a worker thread;
`Intake.admit_compiled` moves it on to `waiting` once that is done.
"""

from __future__ import annotations

import logging
import random
from concurrent.futures import Future
from typing import TYPE_CHECKING

from radixlm.errors import QueueFullError, RequestTooLargeError
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.sessions import SessionParams

if TYPE_CHECKING:
    from radixlm.runtime.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)


class Intake:
    """Validates, seeds and registers the requests given to one `Scheduler`.

    Args:
        sched: the scheduler whose queues, sessions, grammars and SLO controller it uses.
        seed: seeds the generator that draws the seeds of requests that name none
            (``--random-seed``).
    """

    def __init__(self, sched: Scheduler, seed: int):
        self.sched = sched
        self._seed_rng = random.Random(seed)

    def accept(self, req: Req, session: SessionParams | None, pin_key: str | None) -> Future | None:
        """Check `req` and prepare it for the waiting queue (see `Scheduler.add_request`
        for `session`, `pin_key` and the errors raised). Returns its grammar's compile job,
        or None when it is ready to wait now."""
        s = self.sched
        if session is not None:
            req.input_ids = s.sessions.compose(req.rid, session, req.input_ids)
        try:
            s.check_fits(len(req.input_ids), req.params.max_new_tokens)
        except RequestTooLargeError:
            s.counters.rejected += 1
            raise
        if len(s.waiting) + len(s.compiling) >= self.queue_capacity():
            s.counters.rejected += 1
            raise QueueFullError(
                f"waiting queue is full ({s.args.max_queued_requests} requests); retry later"
            )
        if s.slo is not None:
            s.slo.admit(req, s.waiting, self._chunk_left(), s.running)
        job = s.grammars.start(req)  # None: ready; InvalidRequestError: failed before
        seed = req.params.seed
        if seed is None:  # reproducible per engine: drawn in arrival order
            seed = self._seed_rng.getrandbits(63)
        req.seed = seed
        for rid in s.sessions.start(req, session, pin_key):  # replace: other branches
            s.abort(rid)
        return job

    def admit_compiled(self) -> list[Req]:
        """Move the requests whose grammar has compiled into `waiting`, in arrival order.
        Returns those whose compile failed, for the scheduler to abort (the HTTP process
        and `Engine` compile every grammar before queueing it, so only a failure of the
        worker gets here)."""
        s = self.sched
        still: list[tuple[Req, Future]] = []
        failed: list[Req] = []
        for req, job in s.compiling:
            if not job.done():
                still.append((req, job))
                continue
            try:
                s.grammars.finish(req, job)
            except Exception:
                logger.exception("request %s: its grammar did not compile; aborting", req.rid)
                failed.append(req)
                continue
            s.waiting.append(req)
        s.compiling = still
        return failed

    def queue_capacity(self) -> int:
        """Waiting requests accepted: max_queued_requests plus the free running rows, so a
        burst that the next step admits at once is not refused as a full queue."""
        s = self.sched
        busy = len(s.running) + (s.chunked is not None)
        return s.args.max_queued_requests + max(s.args.max_running_requests - busy, 0)

    def _chunk_left(self) -> int:
        """Prompt tokens the request mid-chunk has still to compute (0: none)."""
        c = self.sched.chunked
        return 0 if c is None else c.seq_len - c.kv_len
