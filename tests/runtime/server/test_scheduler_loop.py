"""SchedulerLoop refuses a request it cannot queue with a ReqError instead of dying."""

from __future__ import annotations

from types import SimpleNamespace

from radixlm.config import ServerArgs
from radixlm.errors import QueueFullError, ServerError
from radixlm.runtime.sampling import SamplingParams
from radixlm.runtime.server.messages import GenerateReq, ReqError, decode
from radixlm.runtime.server.scheduler_process import SchedulerLoop


class _Socket:
    """Collects what the loop sends."""

    def __init__(self):
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)


class _Scheduler:
    """Raises `error` from add_request; queues the request otherwise."""

    def __init__(self, error: BaseException | None):
        self.error = error
        self.queued: list = []

    def add_request(self, req, session=None, pin_key=None) -> None:
        if self.error is not None:
            raise self.error
        self.queued.append(req)


def _loop(error: BaseException | None) -> tuple[SchedulerLoop, _Scheduler, _Socket]:
    sched, sock = _Scheduler(error), _Socket()
    loop = SchedulerLoop(ServerArgs(), SimpleNamespace(scheduler=sched), None, sock)
    return loop, sched, sock


def _req(rid: str) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=[1, 2], params=SamplingParams(max_new_tokens=2))


def test_an_unexpected_error_is_a_server_error_refusal():
    loop, _, sock = _loop(RuntimeError("a bug"))
    loop.handle(_req("a"))
    (msg,) = [decode(b) for b in sock.sent]
    assert isinstance(msg, ReqError) and msg.rid == "a" and msg.kind == "server_error"
    err = msg.error()
    assert type(err) is ServerError and "could not queue" in str(err)


def test_a_radixlm_error_keeps_its_type():
    loop, _, sock = _loop(QueueFullError("full"))
    loop.handle(_req("b"))
    (msg,) = [decode(b) for b in sock.sent]
    assert type(msg.error()) is QueueFullError and str(msg.error()) == "full"


def test_a_queued_request_sends_nothing():
    loop, sched, sock = _loop(None)
    loop.handle(_req("c"))
    assert sock.sent == [] and [r.rid for r in sched.queued] == ["c"]
