"""Heartbeats: the HTTP process's liveness judgement, the detokenizer's pacing and
forwarding, the scheduler's beat thread, and the liveness settings' checks."""

from __future__ import annotations

import time

import pytest
import zmq

from radixlm.config import ServerArgs
from radixlm.runtime.server import heartbeat as hb
from radixlm.runtime.server.detokenizer_process import DetokenizerLoop
from radixlm.runtime.server.ipc import IpcPaths, pull_socket, push_socket
from radixlm.runtime.server.messages import Heartbeat, decode, encode


def test_liveness_names_only_the_silent_child():
    live = hb.Liveness(timeout=5.0, now=100.0)
    assert live.silent(104.0) == {}
    live.record(Heartbeat("detokenizer", 3), now=104.0)
    live.record(Heartbeat("scheduler", 7, 1.5), now=102.0)
    assert live.silent(107.5) == {"scheduler": 5.5}
    report = live.report(107.5)
    assert report["scheduler"] == {"last_heard_s": 5.5, "steps": 7, "turn_s": 1.5}
    assert report["detokenizer"] == {"last_heard_s": 3.5, "steps": 3, "turn_s": 0.0}


def test_liveness_counts_a_child_heard_at_start():
    live = hb.Liveness(timeout=2.0, now=10.0)
    assert live.silent(11.9) == {}
    assert set(live.silent(12.5)) == set(hb.CHILDREN)
    assert live.report(10.0)["scheduler"] == {"last_heard_s": 0.0, "steps": 0, "turn_s": 0.0}


def test_pacer_is_due_once_per_interval():
    pacer = hb.Pacer()
    assert pacer.due()
    assert not pacer.due()
    time.sleep(hb.HEARTBEAT_INTERVAL_S + 0.05)
    assert pacer.due()


@pytest.fixture
def sockets():
    """(context, ipc paths, the tokenizer's PULL socket); everything closed after."""
    ctx = zmq.Context()
    ipc = IpcPaths.create()
    try:
        yield ctx, ipc, pull_socket(ctx, ipc.tokenizer)
    finally:
        ctx.destroy(linger=0)
        ipc.remove()


def test_detokenizer_forwards_scheduler_beats_and_beats_itself(sockets):
    ctx, ipc, out = sockets
    recv = pull_socket(ctx, ipc.detokenizer)
    loop = DetokenizerLoop(None, recv, push_socket(ctx, ipc.tokenizer))
    loop.run_once()  # idle: waits one interval, then beats
    first = decode(out.recv())
    assert first == Heartbeat("detokenizer", 0)
    scheduler = push_socket(ctx, ipc.detokenizer)  # kept: closing drops unsent messages
    scheduler.send(encode(Heartbeat("scheduler", 9, 0.1)))
    loop.run_once()  # forwards; its own beat is not due yet
    assert decode(out.recv()) == Heartbeat("scheduler", 9, 0.1)
    assert not out.poll(0)


def test_heartbeat_thread_beats_at_its_interval_and_ends_with_its_context():
    ctx = zmq.Context()
    ipc = IpcPaths.create()
    out = pull_socket(ctx, ipc.tokenizer)
    beats = iter(range(100))
    thread = hb.HeartbeatThread(ctx, ipc.tokenizer, lambda: Heartbeat("scheduler", next(beats)))
    thread.start()
    start = time.monotonic()
    got = [decode(out.recv()).steps for _ in range(3)]
    assert got == [0, 1, 2]
    assert time.monotonic() - start >= 2 * hb.HEARTBEAT_INTERVAL_S - 0.05
    out.close()
    ctx.term()  # returns once the thread saw the termination and closed its socket
    thread.join(2 * hb.HEARTBEAT_INTERVAL_S)
    assert not thread.is_alive()
    ipc.remove()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"health_timeout": 0.5}, "health_timeout"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"request_timeout": -1.0}, "request_timeout"),
    ],
)
def test_liveness_settings_are_checked(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ServerArgs(**kwargs)


def test_liveness_settings_defaults():
    args = ServerArgs(request_timeout=2)
    assert args.request_timeout == 2 and ServerArgs().request_timeout is None
    assert ServerArgs().health_timeout == 5.0
