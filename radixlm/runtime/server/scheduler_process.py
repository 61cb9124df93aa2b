"""The scheduler process: owns the model, pools and radix cache; runs the step loop.

Loop: drain every request message (blocking only while idle), then run one scheduler
step and send its outputs to the detokenizer as one `BatchTokenOut`. Control requests
(flush, info) are answered through the detokenizer, which forwards them unchanged.
A heartbeat thread reports the loop's progress (`steps`, the age of the current turn)
every half second, through the detokenizer too (see heartbeat.py for why a thread).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time

import zmq

from radixlm.config import ServerArgs
from radixlm.errors import InvalidRequestError, RadixLMError, ServerError
from radixlm.runtime.executor.parallel.group import RankFailedError
from radixlm.runtime.sched.request import Req, ReqOutput
from radixlm.runtime.server.disagg_decode import DecodeSide
from radixlm.runtime.server.disagg_prefill import PrefillSide
from radixlm.runtime.server.heartbeat import HeartbeatThread, scheduler_name
from radixlm.runtime.server.info import flush_cache, model_facts, server_info
from radixlm.runtime.server.ipc import IpcPaths, pull_socket, push_socket, run_child
from radixlm.runtime.server.messages import (
    AbortReq,
    BatchTokenOut,
    CloseSessionReq,
    ControlResp,
    FlushCacheReq,
    GenerateReq,
    GetInfoReq,
    Heartbeat,
    Message,
    OpenSessionReq,
    ProcessFailed,
    ReqError,
    UnpinReq,
    decode,
    encode,
)
from radixlm.runtime.server.stack import ServingStack, build_stack

logger = logging.getLogger(__name__)

# A request's (no_stop_trim, skip_special_tokens, spaces_between_special_tokens) defaults.
_DEFAULT_DETOK = (False, True, True)

_IDLE_POLL_MS = 1000
_GRAMMAR_POLL_MS = 5


class SchedulerLoop:
    """Feeds messages into a Scheduler and ships its per-step outputs.

    steps: scheduler steps run so far; turn_start: monotonic time the current
    `run_once` began (both read by the heartbeat thread, see `heartbeat`).
    """

    def __init__(
        self,
        args: ServerArgs,
        stack: ServingStack,
        recv: zmq.Socket,
        send: zmq.Socket,
        name: str = "scheduler",
    ):
        self.args = args
        self.name = name
        self.stack = stack
        self.scheduler = stack.scheduler
        self.recv = recv
        self.send = send
        self._stops: dict[str, list[str]] = {}
        # rid -> (no_stop_trim, skip_special_tokens, spaces_between_special_tokens), kept
        # only for requests that change one of them from its default (False, True, True).
        self._detok: dict[str, tuple[bool, bool, bool]] = {}
        self._after_failure = False
        self.disagg = make_disagg_side(args, stack)
        self.steps = 0
        self.turn_start = time.monotonic()

    def heartbeat(self) -> Heartbeat:
        """This loop's liveness report (called from the heartbeat thread)."""
        return Heartbeat(self.name, self.steps, time.monotonic() - self.turn_start)

    def run_forever(self, stop: threading.Event | None = None) -> None:
        """Serve until the process is killed, or until `stop` is set (checked between
        steps)."""
        while stop is None or not stop.is_set():
            self.run_once()

    def run_once(self) -> None:
        """Handle waiting messages, then run one step (or wait for work while idle)."""
        sched = self.scheduler
        self.turn_start = time.monotonic()
        sched.sessions.expire()  # idle sessions and stored-response pins time out
        parked = isinstance(self.disagg, DecodeSide) and self.disagg.waiting
        idle = not (sched.has_work() or self._after_failure)
        # While grammars compile or requests wait for their KV, wake up often to admit them.
        wait_ms = _GRAMMAR_POLL_MS if sched.compiling or parked else _IDLE_POLL_MS
        if idle and not self.recv.poll(wait_ms) and not (sched.compiling or parked):
            return
        self._after_failure = False
        while True:
            try:
                data = self.recv.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.handle(decode(data))
        if isinstance(self.disagg, DecodeSide):
            for error in self.disagg.poll():
                self._forget(error.rid)
                self.send.send(encode(error))
        self.steps += 1
        try:
            outputs = sched.step()
        except RankFailedError:  # a tensor-parallel rank died: this process cannot serve
            raise
        except Exception:  # the batch was aborted; its outputs come with the next step
            logger.exception("scheduler step failed")
            self._after_failure = True
            return
        if isinstance(self.disagg, PrefillSide):
            outputs, errors = self.disagg.settle(outputs)
            for error in errors:
                self._forget(error.rid)
                self.send.send(encode(error))
        if outputs:
            self.send.send(encode(self._token_out(outputs)))

    def handle(self, msg: Message) -> None:
        """Apply one request message."""
        if isinstance(msg, GenerateReq):
            self._add_request(msg)
        elif isinstance(msg, AbortReq):
            parked = self.disagg.abort(msg.rid) if isinstance(self.disagg, DecodeSide) else None
            if parked is not None:
                self.send.send(encode(self._token_out([parked])))
            else:
                self.scheduler.abort(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            ok, message = flush_cache(self.scheduler)
            self.send.send(encode(ControlResp(msg.rid, ok, message)))
        elif isinstance(msg, GetInfoReq):
            info = server_info(self.args, self.stack.runner, self.scheduler)
            if self.disagg is not None:
                info["disaggregation"] = self.disagg.info()
            self.send.send(encode(ControlResp(msg.rid, True, info=info)))
        elif isinstance(msg, (OpenSessionReq, CloseSessionReq, UnpinReq)):
            self._session_control(msg)
        else:
            logger.error("scheduler got unexpected message %s", type(msg).__name__)

    def _session_control(self, msg: OpenSessionReq | CloseSessionReq | UnpinReq) -> None:
        """Open or close a session (answered with a ControlResp: ok False and the reason
        for a duplicate or unknown id), or release a stored response's pin."""
        sessions = self.scheduler.sessions
        if isinstance(msg, UnpinReq):
            sessions.unpin(msg.key)
            return
        try:
            if isinstance(msg, OpenSessionReq):
                sid = sessions.open(msg.session_id, msg.capacity_of_str_len, msg.timeout)
                resp = ControlResp(msg.rid, True, info={"session_id": sid})
            else:
                for rid in sessions.close(msg.session_id):
                    self.scheduler.abort(rid)
                resp = ControlResp(msg.rid, True)
        except InvalidRequestError as e:
            resp = ControlResp(msg.rid, False, str(e))
        self.send.send(encode(resp))

    def _add_request(self, msg: GenerateReq) -> None:
        """Queue `msg` in the scheduler (a decode worker parks a disaggregated one until
        its KV arrives), or send its refusal (ReqError 503: queue full, 400: any other
        RadixLMError, 503 server_error: an unexpected exception, logged, so one bad
        request never ends this process or leaves its client waiting); remember its stop
        strings and text settings for the detokenizer."""
        try:
            if msg.disagg is not None and self.disagg is None:
                raise InvalidRequestError(
                    "bootstrap_room is for a server started with --disaggregation-mode",
                    param="bootstrap_room",
                )
            if isinstance(self.disagg, DecodeSide) and msg.disagg is not None:
                self.scheduler.check_fits(len(msg.input_ids), msg.params.max_new_tokens)
                self.disagg.park(msg)
            else:
                if isinstance(self.disagg, PrefillSide) and msg.disagg is not None:
                    msg = self.disagg.admit(msg)
                req = Req.new(
                    msg.rid,
                    msg.input_ids,
                    msg.params,
                    extra_key=msg.extra_key,
                    logprobs=msg.logprobs,
                    sched=msg.sched,
                )
                self.scheduler.add_request(req, msg.session, msg.pin_key)
        except RadixLMError as e:  # refused (queue full, too large, bad grammar)
            self._refuse(msg.rid, e)
            return
        except Exception:
            logger.exception("request %s could not be queued", msg.rid)
            self._refuse(msg.rid, ServerError("the scheduler could not queue the request"))
            return
        if msg.params.stop:
            self._stops[msg.rid] = msg.params.stop
        p = msg.params
        flags = (p.no_stop_trim, p.skip_special_tokens, p.spaces_between_special_tokens)
        if flags != _DEFAULT_DETOK:
            self._detok[msg.rid] = flags

    def _refuse(self, rid: str, error: RadixLMError) -> None:
        if isinstance(self.disagg, PrefillSide):
            self.disagg.forget(rid)
        self.send.send(encode(ReqError.of(rid, error)))

    def _forget(self, rid: str) -> None:
        """Drop the detokenizer settings of a request that failed after it was queued."""
        self._stops.pop(rid, None)
        self._detok.pop(rid, None)

    def _token_out(self, outputs: list[ReqOutput]) -> BatchTokenOut:
        """One step's outputs as the detokenizer's message; a finished request's stop
        strings and text settings are forgotten here."""
        stops, flags = [], []
        for o in outputs:
            if o.finish_reason is None:
                stops.append(self._stops.get(o.rid, []))
                flags.append(self._detok.get(o.rid, _DEFAULT_DETOK))
            else:
                stops.append(self._stops.pop(o.rid, []))
                flags.append(self._detok.pop(o.rid, _DEFAULT_DETOK))
        keep, skip, spaces = (list(column) for column in zip(*flags)) if flags else ([], [], [])
        out_lp = [o.output_logprobs for o in outputs]
        in_lp = [o.input_logprobs for o in outputs]
        return BatchTokenOut(
            rids=[o.rid for o in outputs],
            new_token_ids=[o.new_token_ids for o in outputs],
            finish_reasons=[o.finish_reason for o in outputs],
            matched_stops=[o.matched_stop for o in outputs],
            prompt_tokens=[o.prompt_tokens for o in outputs],
            completion_tokens=[o.completion_tokens for o in outputs],
            cached_tokens=[o.cached_tokens for o in outputs],
            stops=stops,
            no_stop_trim=keep if any(keep) else [],
            skip_special_tokens=skip if not all(skip) else [],
            spaces_between_special_tokens=spaces if not all(spaces) else [],
            output_logprobs=out_lp if any(x is not None for x in out_lp) else [],
            input_logprobs=in_lp if any(x is not None for x in in_lp) else [],
            queue_times=[o.queue_time for o in outputs],
            spec_accept_lengths=[o.spec_accept_length for o in outputs],
        )


def make_disagg_side(args: ServerArgs, stack: ServingStack) -> PrefillSide | DecodeSide | None:
    """The disaggregation side of --disaggregation-mode (None: colocated)."""
    if args.disaggregation_mode == "prefill":
        return PrefillSide(args, stack.scheduler, stack.runner.kv_pool)
    if args.disaggregation_mode == "decode":
        return DecodeSide(args, stack.scheduler, stack.runner.kv_pool)
    return None


def run_scheduler_process(args: ServerArgs, ipc: IpcPaths, status_conn, rank: int = 0) -> None:
    """Entry point of scheduler replica `rank` (multiprocessing target). It reads
    ``ipc.schedulers[rank]`` and runs with --num-threads / --dp-size torch threads (at
    least 1), so the replicas share the threads the server was given."""
    name = scheduler_name(rank, args.dp_size)
    if args.dp_size > 1:
        args = dataclasses.replace(args, num_threads=max(1, args.num_threads // args.dp_size))

    def fail(error: str) -> None:
        """A tensor-parallel rank died (watchdog thread): report it and end the process."""
        try:
            status_conn.send_bytes(encode(ProcessFailed(name, error)))
        finally:
            os._exit(1)

    def body(ready) -> None:
        ctx = zmq.Context()
        recv = pull_socket(ctx, ipc.schedulers[rank])
        send = push_socket(ctx, ipc.detokenizer)
        stack = build_stack(args, on_rank_failure=fail)
        loop = SchedulerLoop(args, stack, recv, send, name)
        HeartbeatThread(ctx, ipc.detokenizer, loop.heartbeat).start()
        stop = threading.Event()
        if stack.ranks is not None:
            # SIGTERM ends the loop between steps, so that every rank (other nodes' too)
            # takes the shutdown step and leaves cleanly.
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        ready(model_facts(stack))
        loop.run_forever(stop)
        stack.close()

    run_child(name, args.log_level, status_conn, body)
