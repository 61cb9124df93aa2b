"""The detokenizer process: token ids -> text deltas, per request, off the scheduler's path.

Each `BatchTokenOut` becomes one `BatchStrOut` (UTF-8 safe, stop strings cut and held
back, see `RequestDetokenizer`); every other message (control replies, request errors)
is forwarded to the TokenizerManager unchanged, the scheduler's heartbeats too. The loop
beats for itself at most once per `HEARTBEAT_INTERVAL_S`, waking at that interval when
no message comes (see heartbeat.py).
"""

from __future__ import annotations

import logging

import msgspec
import zmq

from radixlm.config import ServerArgs
from radixlm.runtime.server.detokenizer import RequestDetokenizer
from radixlm.runtime.server.heartbeat import HEARTBEAT_INTERVAL_S, Pacer
from radixlm.runtime.server.ipc import IpcPaths, pull_socket, push_socket, run_child
from radixlm.runtime.server.messages import (
    BatchStrOut,
    BatchTokenOut,
    Heartbeat,
    decode,
    encode,
)
from radixlm.runtime.server.stack import load_tokenizer

logger = logging.getLogger(__name__)

_POLL_MS = int(HEARTBEAT_INTERVAL_S * 1000)


class DetokenizerLoop:
    """Keeps one RequestDetokenizer per running request (dropped when it finishes).

    steps: BatchTokenOut messages converted so far (reported in its heartbeats)."""

    def __init__(self, tokenizer, recv: zmq.Socket, send: zmq.Socket):
        self.tokenizer = tokenizer
        self.recv = recv
        self.send = send
        self.states: dict[str, RequestDetokenizer] = {}
        self.steps = 0
        self._pacer = Pacer()

    def run_forever(self) -> None:
        """Serve until the process is killed."""
        while True:
            self.run_once()

    def run_once(self) -> None:
        """Handle the next message (waiting at most one heartbeat interval); beat if due."""
        if self.recv.poll(_POLL_MS):
            data = self.recv.recv()
            msg = decode(data)
            if isinstance(msg, BatchTokenOut):
                self.steps += 1
                self.send.send(encode(self.convert(msg)))
            else:
                self.send.send(data)
        if self._pacer.due():
            self.send.send(encode(Heartbeat("detokenizer", self.steps)))

    def convert(self, batch: BatchTokenOut) -> BatchStrOut:
        """Text deltas for one step's tokens."""
        texts = []
        for i, rid in enumerate(batch.rids):
            state = self.states.get(rid)
            if state is None:
                keep = bool(batch.no_stop_trim) and batch.no_stop_trim[i]
                skip = not batch.skip_special_tokens or batch.skip_special_tokens[i]
                spaces = (
                    not batch.spaces_between_special_tokens
                    or batch.spaces_between_special_tokens[i]
                )
                state = RequestDetokenizer(self.tokenizer, batch.stops[i], keep, skip, spaces)
                self.states[rid] = state
            finished = batch.finish_reasons[i] is not None
            texts.append(state.add(batch.new_token_ids[i], finished, batch.matched_stops[i]))
            if finished:
                del self.states[rid]
        fields = msgspec.structs.asdict(batch)
        for name in (
            "stops",
            "no_stop_trim",
            "skip_special_tokens",
            "spaces_between_special_tokens",
        ):
            del fields[name]
        return BatchStrOut(**fields, texts=texts)


def run_detokenizer_process(args: ServerArgs, ipc: IpcPaths, status_conn) -> None:
    """Entry point of the detokenizer process (multiprocessing target)."""

    def body(ready) -> None:
        ctx = zmq.Context()
        recv = pull_socket(ctx, ipc.detokenizer)
        send = push_socket(ctx, ipc.tokenizer)
        loop = DetokenizerLoop(load_tokenizer(args), recv, send)
        ready()
        loop.run_forever()

    run_child("detokenizer", args.log_level, status_conn, body)
