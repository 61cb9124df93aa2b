"""Helpers for scheduler tests: drive a Scheduler directly and check the pool invariant."""

from __future__ import annotations

import itertools

from radixlm.runtime.request import Req, ReqOutput
from radixlm.runtime.sampling import SamplingParams

_rids = itertools.count()


def make_req(ids: list[int], max_new: int = 16, extra_key=None, **params) -> Req:
    """A greedy request with a unique rid."""
    p = SamplingParams(max_new_tokens=max_new, temperature=0, **params)
    return Req(rid=f"t{next(_rids)}", input_ids=list(ids), params=p, extra_key=extra_key)


def run_all(sched, max_steps: int = 100_000) -> dict[str, list[ReqOutput]]:
    """Step until idle; outputs per rid in order."""
    outs: dict[str, list[ReqOutput]] = {}
    for _ in range(max_steps):
        if not (sched.waiting or sched.running or sched.chunked):
            for o in sched.step():  # flush pending abort events
                outs.setdefault(o.rid, []).append(o)
            return outs
        for o in sched.step():
            outs.setdefault(o.rid, []).append(o)
    raise AssertionError("scheduler did not go idle")


def tokens(outs: list[ReqOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def check_pool(sched, idle: bool) -> None:
    """free + evictable + protected + held == total; nothing held or locked when idle."""
    mem = sched.memory_accounting()
    assert mem["free"] + mem["evictable"] + mem["protected"] + mem["held"] == mem["total"], mem
    if idle:
        assert mem["held"] == 0 and mem["protected"] == 0, mem
        assert sched.req_pool.available() == sched.req_pool.size
