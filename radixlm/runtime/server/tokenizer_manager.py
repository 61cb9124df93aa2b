"""TokenizerManager: the HTTP process's asyncio client of the scheduler pipeline.

It validates and sends tokenized requests to the scheduler process, receives text
deltas from the detokenizer process, and hands them to the per-request async iterators
that the HTTP routes stream from. Closing an iterator early (client disconnect) aborts
its request in the scheduler, which frees its KV slots at once.

Liveness: the scheduler's and the detokenizer's heartbeats are recorded here
(`Liveness`, see heartbeat.py); `health()` names a child silent for longer than
`args.health_timeout`. With `args.request_timeout` set, a request (or control call) that
has waited and run longer is ended with RequestTimeoutError and aborted in the scheduler,
as a client disconnect is; the deadline is checked only while waiting for output (an
asyncio timeout), never in the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from radixlm.config import ServerArgs
from radixlm.errors import (
    InvalidRequestError,
    RequestTimeoutError,
    RequestTooLargeError,
    ServerError,
)
from radixlm.runtime.sampling.grammar import GrammarCompiler
from radixlm.runtime.sampling.logprobs import LogprobOptions
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.request import SchedOptions
from radixlm.runtime.sched.sessions import SessionParams
from radixlm.runtime.server.dispatcher import make_policy
from radixlm.runtime.server.heartbeat import Liveness, scheduler_name
from radixlm.runtime.server.ipc import IpcPaths, pull_socket
from radixlm.runtime.server.messages import (
    AbortReq,
    BatchStrOut,
    CloseSessionReq,
    ControlResp,
    DisaggParams,
    FlushCacheReq,
    GenerateReq,
    GetInfoReq,
    Heartbeat,
    Message,
    OpenSessionReq,
    ReqError,
    UnpinReq,
    decode,
    encode,
)
from radixlm.runtime.server.replicas import ReplicaSet
from radixlm.runtime.server.request_checks import check_request
from radixlm.runtime.server.request_observer import RequestObserver
from radixlm.runtime.server.stack import load_tokenizer

logger = logging.getLogger(__name__)


class _ReqState:
    """Chunks received for one request and the event that wakes its iterator;
    `abort_requested`: stopped through `abort_matching` (POST /abort_request)."""

    __slots__ = ("chunks", "event", "finished", "error", "abort_requested")

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.event = asyncio.Event()
        self.finished = False
        self.error: Exception | None = None
        self.abort_requested = False


class TokenizerManager:
    """Front end of the scheduler: validation, request routing, streaming, aborts.

    Args:
        args: server settings. ipc: endpoints of this server instance.
        facts: model limits reported by the scheduler process at start-up
            (vocab_size, context_length, max_total_tokens).
        tokenizer: the model's tokenizer if already loaded (else loaded here).

    Attributes: tokenizer (Hugging Face), model_name (served name), context_len,
    vocab_size, max_total_tokens (KV pool size in tokens), observer (a RequestObserver,
    e.g. the server's Prometheus metrics; a no-op by default), liveness (when each child
    process last beat, see heartbeat.py), replicas (the scheduler replicas and where
    each request went, `ReplicaSet`; one replica unless --dp-size > 1).
    """

    def __init__(self, args: ServerArgs, ipc: IpcPaths, facts: dict[str, int], tokenizer=None):
        self.args = args
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(args)
        self.model_name = args.served_model_name or args.model
        self.vocab_size = facts["vocab_size"]
        self.context_len = facts["context_length"]
        self.max_total_tokens = facts["max_total_tokens"]
        self.max_prompt_chars = self.context_len * _longest_token_chars(self.tokenizer)
        # Grammars are compiled here too (cached), so a bad one is a 400 before queuing.
        stops = [] if self.tokenizer.eos_token_id is None else [self.tokenizer.eos_token_id]
        self.grammars = GrammarCompiler(
            self.tokenizer, self.vocab_size, stops, compile_timeout=args.grammar_compile_timeout
        )
        self._ctx = zmq.asyncio.Context()
        self._ipc = ipc
        policy = make_policy(
            args.dp_policy, args.dp_size, balance_threshold=args.dp_balance_threshold
        )
        self.replicas = ReplicaSet(ipc.schedulers, policy)
        self._recv: zmq.asyncio.Socket | None = None
        self._states: dict[str, _ReqState] = {}
        self._control: dict[str, asyncio.Future] = {}
        self._task: asyncio.Task | None = None
        self.observer = RequestObserver()
        names = tuple(scheduler_name(r, args.dp_size) for r in range(args.dp_size))
        self.liveness = Liveness(args.health_timeout, time.monotonic(), (*names, "detokenizer"))
        self._silent: frozenset[str] = frozenset()

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the result socket and start the receive loop (call inside the event loop)."""
        self._recv = pull_socket(self._ctx, self._ipc.tokenizer)
        self.replicas.connect(self._ctx)
        self._task = asyncio.create_task(self._recv_loop(), name="tokenizer-manager-recv")

    async def close(self) -> None:
        """Stop the receive loop and fail every pending request with ServerError."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.fail_pending("the server is shutting down")
        for fut in self._control.values():
            if not fut.done():
                fut.set_exception(ServerError("the server is shutting down"))
        self._ctx.destroy(linger=0)

    def fail_pending(self, message: str) -> None:
        """End every in-flight request's iterator with ServerError(message) (shutdown)."""
        for state in self._states.values():
            state.error = ServerError(message)
            state.event.set()

    def health(self) -> str | None:
        """None while every child process has beaten within `args.health_timeout` s, else
        why not (logged once per change of the silent set)."""
        silent = self.liveness.silent(time.monotonic())
        if frozenset(silent) != self._silent:
            self._silent = frozenset(silent)
            if silent:
                logger.warning("no heartbeat: %s", _describe(silent))
            else:
                logger.info("every child process beats again")
        if not silent:
            return None
        return f"the server is not responding: {_describe(silent)}"

    # ---- requests ---------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of a plain prompt, with the special tokens the tokenizer adds by default
        (a BOS where its post-processor adds one; as `Engine`, SGLang and vLLM do).

        Raises RequestTooLargeError (param "prompt") without tokenizing when `text` has more
        characters than `max_prompt_chars` = context length x the longest token's
        characters, a bound that makes it certainly longer than the context, and right
        after tokenizing when the prompt has as many tokens as the context (so a list of
        long prompts stops at the first one that cannot fit).
        """
        self.check_chars(len(text))
        ids = self.tokenizer.encode(text) if text else []
        if len(ids) >= self.context_len:
            raise RequestTooLargeError(
                f"prompt has {len(ids)} tokens; the context length is {self.context_len}",
                param="prompt",
            )
        return ids

    def check_chars(self, n_chars: int) -> None:
        """Raise RequestTooLargeError (param "prompt") when `n_chars` of text must exceed
        the context."""
        if n_chars > self.max_prompt_chars:
            raise RequestTooLargeError(
                f"the prompt has {n_chars} characters, more than the context length of "
                f"{self.context_len} tokens can hold",
                param="prompt",
            )

    def validate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        logprobs: LogprobOptions | None = None,
        wait: bool = True,
    ) -> None:
        """Raise InvalidRequestError for a request that can never run (check_request:
        prompt + max_new_tokens beyond the context is refused, not capped, docs/serving.md
        "Limits"), bad logprob options, or a grammar that does not compile (`wait` False:
        that is cached as not compiling; GrammarCompiler.validate)."""
        if logprobs is not None:
            logprobs.validate(self.vocab_size, len(input_ids))
        check_request(
            input_ids,
            params,
            vocab_size=self.vocab_size,
            context_len=self.context_len,
            max_total_tokens=self.max_total_tokens,
            page_size=self.args.page_size,
            cap_to_context=False,
        )
        self.grammars.validate(params, wait)

    async def generate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        rid: str | None = None,
        extra_key: str | None = None,
        logprobs: LogprobOptions | None = None,
        session: SessionParams | None = None,
        pin_key: str | None = None,
        disagg: DisaggParams | None = None,
        sched: SchedOptions | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Run one request; yield its chunks as they arrive. With `session` it is a turn
        of that session (the scheduler prepends the continued turn's sequence); with
        `pin_key` its finished sequence stays pinned in the cache until `unpin(pin_key)`;
        with `disagg` it is one half of a prefill/decode disaggregated request
        (runtime/disagg/).
        `sched`: its priority and SLO targets (None: defaults).

        Each chunk: ``rid``, ``text`` (new text), ``output_ids`` (new token ids),
        ``finish_reason`` (None or a `FinishReason`), ``matched_stop``, and
        ``output_logprobs`` / ``input_logprobs`` (`TokenLogprobs` or None; see
        `ReqOutput`); the last chunk also has ``usage`` {prompt_tokens,
        completion_tokens, cached_tokens}.

        Raises InvalidRequestError (bad request, checked before anything is sent, or a
        duplicate rid, param "rid"), QueueFullError (scheduler queue full), ServerError
        (shutdown), RequestTimeoutError (no last chunk within `args.request_timeout`
        seconds of the call; the request is aborted); an error the scheduler process
        refused the request with is raised again here with its type and fields
        (`ReqError`).
        Closing the iterator before the last chunk aborts the request.
        """
        lp = logprobs or LogprobOptions()
        self.validate(input_ids, params, lp, wait=False)  # on the loop: routes compiled it
        rid = rid or uuid.uuid4().hex
        if rid in self._states:
            raise InvalidRequestError(
                f"request id {rid!r} is already in use", param="rid", code="invalid_value"
            )
        if not self.replicas.connected:
            raise ServerError("the tokenizer manager is not started")
        data = _encode_request(
            GenerateReq(
                rid=rid,
                input_ids=input_ids,
                params=params,
                extra_key=extra_key,
                logprobs=lp,
                session=session,
                pin_key=pin_key,
                disagg=disagg,
                sched=sched or SchedOptions(),
            )
        )
        state = self._states[rid] = _ReqState()
        rank = self.replicas.route(rid, input_ids, extra_key, session)
        deadline = self._deadline()
        try:
            self.observer.on_submit(rid, time.perf_counter())
            await self.replicas.socket(rank).send(data)
            while True:
                await self._wait(state.event.wait(), deadline, "request")
                state.event.clear()
                if state.error is not None:
                    raise state.error
                chunks, state.chunks = state.chunks, []
                for chunk in chunks:
                    if state.abort_requested and chunk.get("finish_reason") is not None:
                        chunk = {**chunk, "abort_requested": True}
                    yield chunk
                if state.finished:
                    return
        finally:
            self._states.pop(rid, None)
            if not state.finished:
                if state.error is None:
                    self.abort(rid)
                self.observer.on_abandoned(
                    rid, time.perf_counter(), refused=state.error is not None
                )
            self.replicas.release(rid)

    def abort(self, rid: str) -> None:
        """Ask the scheduler replica holding `rid` to stop it (every replica when none
        holds it here; a no-op for unknown or finished requests)."""
        rank = self.replicas.rank_of(rid)
        data = encode(AbortReq(rid))
        for sock in self.replicas.sockets() if rank is None else [self.replicas.socket(rank)]:
            sock.send(data)

    def abort_matching(self, rid: str | None) -> list[str]:
        """Abort the in-flight requests whose id is `rid` or starts with `rid` + "-" (a
        response's choices, /generate's samples), or every one for None; returns their
        ids, sorted. Their iterators end with an abort finish whose last chunk carries
        ``abort_requested: True`` (the routes tell it from a server-side abort)."""
        matched = sorted(
            r for r in self._states if rid is None or r == rid or r.startswith(f"{rid}-")
        )
        for r in matched:
            self._states[r].abort_requested = True
            self.abort(r)
        return matched

    async def get_server_info(self) -> dict[str, Any]:
        """The scheduler's settings, capacity and counters (see info.server_info; over
        several replicas see `ReplicaSet.merge_infos`: ``dp_size``, ``replicas``), and
        ``liveness``: each child's last heartbeat (see `Liveness.report`)."""
        resps = await self._control_all(GetInfoReq)
        info = self.replicas.merge_infos([r.info for r in resps])
        return {**info, "liveness": self.liveness.report(time.monotonic())}

    async def open_session(
        self, session_id: str | None, capacity_of_str_len: int, timeout: float | None = None
    ) -> str:
        """Open a session in the scheduler; returns its id. Raises InvalidRequestError
        (param session_id) when that id is already open."""

        def msg(rid: str) -> OpenSessionReq:
            return OpenSessionReq(
                rid=rid,
                session_id=session_id,
                capacity_of_str_len=capacity_of_str_len,
                timeout=timeout,
            )

        rank = self.replicas.rank_for_new_session(session_id)
        resp = await self._control_call(msg, rank)
        if not resp.ok:
            raise InvalidRequestError(resp.message, param="session_id", code="invalid_value")
        self.replicas.bind_session(resp.info["session_id"], rank)
        return resp.info["session_id"]

    async def close_session(self, session_id: str) -> None:
        """Close a session (its pin released, its running requests aborted). Raises
        InvalidRequestError (param session_id) when it does not exist."""
        rank = self.replicas.session_rank(session_id)
        resp = await self._control_call(lambda rid: CloseSessionReq(rid, session_id), rank)
        if not resp.ok:
            raise InvalidRequestError(resp.message, param="session_id", code="invalid_value")
        self.replicas.unbind_session(session_id)

    def unpin(self, key: str) -> None:
        """Release the pin a request made with `pin_key=key` (unknown keys are ignored, so
        every replica is told)."""
        data = encode(UnpinReq(key))
        for sock in self.replicas.sockets():
            sock.send(data)

    async def flush_cache(self) -> tuple[bool, str]:
        """Drop every replica's prefix cache; (False, reason) while requests run or wait
        on a replica (the others are flushed)."""
        resps = await self._control_all(FlushCacheReq)
        refused = [f"replica {r}: {x.message}" for r, x in enumerate(resps) if not x.ok]
        if any(x.ok for x in resps):
            self.replicas.policy.forget()
        if len(resps) == 1 or not refused:
            return resps[0].ok, resps[0].message
        return False, "; ".join(refused)

    async def _control_all(self, kind) -> list[ControlResp]:
        """`_control_call(kind)` on every replica at once; the replies by rank."""
        calls = [self._control_call(kind, r) for r in range(len(self.replicas))]
        return list(await asyncio.gather(*calls))

    async def _control_call(self, kind, rank: int = 0) -> ControlResp:
        """Send a control request to replica `rank` and await its reply. Raises
        RequestTimeoutError after `args.request_timeout` seconds (a frozen scheduler never
        answers)."""
        rid = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self._control[rid] = fut
        deadline = self._deadline()
        try:
            await self.replicas.socket(rank).send(encode(kind(rid)))
            return await self._wait(fut, deadline, "control request")
        finally:
            self._control.pop(rid, None)

    def _deadline(self) -> float | None:
        """Event-loop time by which a call started now must end (None: no limit)."""
        if self.args.request_timeout is None:
            return None
        return asyncio.get_running_loop().time() + self.args.request_timeout

    async def _wait(self, aw, deadline: float | None, what: str):
        """Await `aw` until event-loop time `deadline` (None: without limit).

        Raises RequestTimeoutError (naming `what`) when the deadline passes first.
        """
        if deadline is None:
            return await aw
        try:
            async with asyncio.timeout_at(deadline):
                return await aw
        except TimeoutError:
            raise RequestTimeoutError(
                f"the {what} did not finish within --request-timeout "
                f"({self.args.request_timeout:g} s)"
            ) from None

    # ---- results ----------------------------------------------------------------------

    async def _recv_loop(self) -> None:
        while True:
            data = await self._recv.recv()
            try:
                self._dispatch(decode(data))
            except Exception:
                logger.exception("bad message from the detokenizer")

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, BatchStrOut):
            self.observer.on_batch(msg, time.perf_counter())
            self._on_batch(msg)
        elif isinstance(msg, ReqError):
            state = self._states.get(msg.rid)
            if state is not None:
                state.error = msg.error()
                state.event.set()
        elif isinstance(msg, Heartbeat):
            self.liveness.record(msg, time.monotonic())
        elif isinstance(msg, ControlResp):
            fut = self._control.get(msg.rid)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        else:
            logger.error("unexpected message %s", type(msg).__name__)

    def _on_batch(self, b: BatchStrOut) -> None:
        for i, rid in enumerate(b.rids):
            state = self._states.get(rid)
            if state is None:  # the client went away; its abort is on the way
                continue
            reason = b.finish_reasons[i]
            chunk: dict[str, Any] = {
                "rid": rid,
                "text": b.texts[i],
                "output_ids": b.new_token_ids[i],
                "finish_reason": reason,
                "matched_stop": b.matched_stops[i],
                "output_logprobs": b.output_logprobs[i] if b.output_logprobs else None,
                "input_logprobs": b.input_logprobs[i] if b.input_logprobs else None,
            }
            if reason is not None:
                state.finished = True
                chunk["usage"] = {
                    "prompt_tokens": b.prompt_tokens[i],
                    "completion_tokens": b.completion_tokens[i],
                    "cached_tokens": b.cached_tokens[i],
                }
                if b.spec_accept_lengths and b.spec_accept_lengths[i]:
                    chunk["usage"]["spec_accept_length"] = b.spec_accept_lengths[i]
            state.chunks.append(chunk)
            state.event.set()


def _encode_request(msg: GenerateReq) -> bytes:
    """The wire bytes of `msg`. A value msgpack cannot hold (an int of 2**64 or more) is
    the client's fault, so it raises InvalidRequestError (param None, code
    "invalid_value") rather than a server error; validation bounds every int field, so
    this is a backstop for a field it missed."""
    try:
        return encode(msg)
    except (OverflowError, msgspec.EncodeError) as e:
        raise InvalidRequestError(
            f"the request holds a value out of range: {e}", code="invalid_value"
        ) from None


def _describe(silent: dict[str, float]) -> str:
    """'scheduler process silent for 6.1 s, ...' for {child: seconds since its beat}."""
    return ", ".join(f"{name} process silent for {s:.1f} s" for name, s in silent.items())


def _longest_token_chars(tokenizer) -> int:
    """Most characters any single token (vocabulary or added) decodes to, at least 1."""
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    return max(longest, 1)
