"""Liveness of the child processes: heartbeats and the HTTP process's judgement of them.

Design:
- The scheduler beats from a daemon thread (`HeartbeatThread`) with its own PUSH socket
  to the detokenizer, every `HEARTBEAT_INTERVAL_S`. A thread keeps beating while the main
  loop is inside a long forward step (torch and radixlm's C kernels release the GIL), so
  a big prefill never looks like a dead server, and it costs the step loop nothing. A
  frozen (SIGSTOP), killed or swapped-out process stops every thread, so its beats stop.
  A main loop stuck in Python (a deadlock) would still beat: each beat therefore carries
  the loop's step counter and the age of its current turn, which `/get_server_info`
  shows under ``liveness`` so a stall is visible as steps that stop moving.
- The detokenizer forwards the scheduler's beats unchanged (as every message it does not
  convert) and beats for itself from its main loop, at most once per interval
  (`Pacer`); it waits for input with that interval as its poll timeout, so it beats
  when idle too. A stuck detokenizer silences both, which is the truth: nothing reaches
  the clients.
- The TokenizerManager records when it last heard from each child (`Liveness`, its own
  monotonic clock); `GET /health` answers 503 when one has been silent for longer than
  `ServerArgs.health_timeout` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from radixlm.runtime.server.ipc import push_socket
from radixlm.runtime.server.messages import Heartbeat, encode

#: Seconds between two beats of one child process.
HEARTBEAT_INTERVAL_S = 0.5
#: The children that beat, by Heartbeat.name.
CHILDREN = ("scheduler", "detokenizer")


def scheduler_name(rank: int, dp_size: int) -> str:
    """The process and heartbeat name of scheduler replica `rank`: ``scheduler`` for a
    server with one replica, else ``scheduler-<rank>``."""
    return "scheduler" if dp_size == 1 else f"scheduler-{rank}"


class HeartbeatThread(threading.Thread):
    """Sends `beat()` (a Heartbeat) to `endpoint` every HEARTBEAT_INTERVAL_S, from a
    daemon thread with its own PUSH socket on `ctx` (ZMQ sockets are not thread-safe);
    it closes the socket and ends when `ctx` is terminated."""

    def __init__(self, ctx: zmq.Context, endpoint: str, beat: Callable[[], Heartbeat]):
        super().__init__(name="heartbeat", daemon=True)
        self._ctx = ctx
        self._endpoint = endpoint
        self._beat = beat

    def run(self) -> None:
        sock = push_socket(self._ctx, self._endpoint)
        try:
            while True:
                sock.send(encode(self._beat()))
                time.sleep(HEARTBEAT_INTERVAL_S)
        except zmq.ContextTerminated:
            sock.close()


class Pacer:
    """True at most once per HEARTBEAT_INTERVAL_S (`due`), for a loop that beats itself."""

    def __init__(self) -> None:
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + HEARTBEAT_INTERVAL_S
        return True


class Liveness:
    """When the HTTP process last heard from each child, and what its last beat said.

    Args:
        timeout: seconds of silence after which a child counts as not alive.
        now: the start of the watch (monotonic seconds); every child counts as heard then.
        children: the names of the children that beat (a data-parallel server has one
            ``scheduler-R`` per replica).
    """

    def __init__(self, timeout: float, now: float, children: tuple[str, ...] = CHILDREN):
        self.timeout = timeout
        self._heard = dict.fromkeys(children, now)
        self._last: dict[str, Heartbeat] = {}

    def record(self, beat: Heartbeat, now: float) -> None:
        """Note `beat`, received at monotonic time `now`."""
        self._heard[beat.name] = now
        self._last[beat.name] = beat

    def silent(self, now: float) -> dict[str, float]:
        """{child: seconds since its last beat} for each child silent beyond `timeout`."""
        return {n: now - t for n, t in self._heard.items() if now - t > self.timeout}

    def report(self, now: float) -> dict[str, dict[str, float | int]]:
        """Per child: ``last_heard_s`` (seconds since its last beat), ``steps`` (loop
        steps it has run) and ``turn_s`` (seconds its main loop had been in its current
        turn when it beat; 0 for a loop that beats between turns)."""
        out = {}
        for name, heard in self._heard.items():
            beat = self._last.get(name)
            out[name] = {
                "last_heard_s": round(now - heard, 3),
                "steps": beat.steps if beat else 0,
                "turn_s": round(beat.turn_s, 3) if beat else 0.0,
            }
        return out
