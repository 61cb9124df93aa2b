"""Sessions and pins in the scheduler, on a small KV pool where eviction matters: a turn
continues the earlier turn's full sequence from the cache even after traffic that evicts
everything unpinned; close, timeout and the pin budget release pins; the pool invariant
(free + evictable + protected + pinned + held == total) holds throughout."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.errors import InvalidRequestError
from radixlm.runtime.sched.sessions import SessionParams
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool, make_req, run_all, tokens

POOL = 256


@pytest.fixture(scope="module")
def engine():
    with Engine(MODEL, max_total_tokens=POOL, max_running_requests=2) as e:
        yield e


@pytest.fixture
def sched(engine):
    s = engine.scheduler
    yield s
    for sid in list(s.sessions.sessions):
        s.sessions.close(sid)
    s.pins.release_all()
    s.pins.budget = POOL // 4
    run_all(s)
    check_pool(s, idle=True)


def _ids(seed: int, n: int) -> list[int]:
    return [100 + (seed * 7919 + i * 31) % 30000 for i in range(n)]


def _turn(sched, ids, session=None, max_new=8, pin_key=None):
    req = make_req(ids, max_new=max_new, ignore_eos=True)
    sched.add_request(req, session, pin_key)
    outs = run_all(sched)
    check_pool(sched, idle=False)
    return req, outs[req.rid]


def test_turn_two_hits_turn_one_after_evicting_traffic(sched):
    sid = sched.sessions.open(None, 0)
    first, _ = _turn(sched, _ids(1, 40), SessionParams(id=sid))
    control, _ = _turn(sched, _ids(100, 40))  # the same size, no session
    full = first.all_ids
    mem = sched.memory_accounting()
    assert mem["pinned"] == len(full) - 1  # the last output token has no KV yet
    for seed in range(2, 8):  # 6 x 48 tokens of other traffic > what the pool can keep
        _turn(sched, _ids(seed, 40))
    second, outs = _turn(sched, _ids(9, 6), SessionParams(id=sid, rid=first.rid))
    assert second.input_ids == full + _ids(9, 6)
    assert outs[-1].cached_tokens == len(full) - 1
    # the unpinned control sequence, used more recently than turn 1, was evicted
    assert len(sched.tree.match_prefix(control.all_ids).kv_indices) < 10
    sched.sessions.close(sid)
    assert sched.memory_accounting()["pinned"] == 0
    check_pool(sched, idle=True)


def test_session_output_equals_concatenated_prompt(sched):
    sid = sched.sessions.open("greedy", 0)
    first, _ = _turn(sched, _ids(11, 20), SessionParams(id=sid))
    second, outs = _turn(sched, _ids(12, 5), SessionParams(id=sid, rid=first.rid), max_new=10)
    sched.sessions.close(sid)
    sched.pins.release_all()
    sched.tree.evict(sched.tree.evictable_size())
    plain, plain_outs = _turn(sched, first.all_ids + _ids(12, 5), max_new=10)
    assert plain_outs[-1].cached_tokens == 0
    assert tokens(outs) == tokens(plain_outs) and len(tokens(outs)) == 10


def test_offset_and_errors(sched):
    sid = sched.sessions.open("s", 0)
    with pytest.raises(InvalidRequestError) as e:
        sched.sessions.open("s", 0)
    assert e.value.param == "session_id"
    first, _ = _turn(sched, _ids(21, 12), SessionParams(id=sid))
    second, _ = _turn(sched, _ids(22, 3), SessionParams(id=sid, rid=first.rid, offset=5))
    assert second.input_ids == first.all_ids[:5] + _ids(22, 3)
    with pytest.raises(InvalidRequestError) as e:
        sched.add_request(make_req([5, 6]), SessionParams(id="nope"))
    assert e.value.param == "session_params.id"
    with pytest.raises(InvalidRequestError) as e:
        sched.add_request(make_req([5, 6]), SessionParams(id=sid, rid="unknown"))
    assert e.value.param == "session_params.rid"
    sched.sessions.close(sid)
    with pytest.raises(InvalidRequestError):
        sched.sessions.close(sid)
    with pytest.raises(InvalidRequestError):
        sched.add_request(make_req([5, 6]), SessionParams(id=sid, rid=first.rid))
    assert not sched.waiting and sched.memory_accounting()["pinned"] == 0


def test_replace_drops_other_branches(sched):
    sid = sched.sessions.open(None, 0)
    root, _ = _turn(sched, _ids(31, 8), SessionParams(id=sid))
    branch, _ = _turn(sched, _ids(32, 3), SessionParams(id=sid, rid=root.rid))
    _turn(sched, _ids(33, 3), SessionParams(id=sid, rid=root.rid, replace=True))
    with pytest.raises(InvalidRequestError):
        sched.add_request(make_req([5]), SessionParams(id=sid, rid=branch.rid))


def test_abort_leaves_no_pin(sched):
    sid = sched.sessions.open(None, 0)
    req = make_req(_ids(41, 10), max_new=50, ignore_eos=True)
    sched.add_request(req, SessionParams(id=sid))
    sched.step()
    assert sched.abort(req.rid)
    run_all(sched)
    assert sched.memory_accounting()["pinned"] == 0 and len(sched.pins) == 0
    sched.sessions.close(sid)
    check_pool(sched, idle=True)


def test_timeout_closes(sched):
    now = [0.0]
    sched.sessions.clock = sched.pins.clock = lambda: now[0]
    try:
        sid = sched.sessions.open(None, 0, timeout=5.0)
        _turn(sched, _ids(51, 10), SessionParams(id=sid))
        _turn(sched, _ids(52, 10), pin_key="response:r1")
        assert len(sched.pins) == 2
        now[0] = 4.0
        sched.sessions.expire()
        assert sid in sched.sessions.sessions
        now[0] = 6.0
        sched.sessions.expire()
        assert sid not in sched.sessions.sessions and len(sched.pins) == 1
        now[0] = 6.0 + sched.sessions.timeout + 1
        sched.sessions.expire()
        assert len(sched.pins) == 0 and sched.memory_accounting()["pinned"] == 0
    finally:
        sched.sessions.clock = sched.pins.clock = __import__("time").monotonic
    check_pool(sched, idle=True)


def test_budget_releases_oldest(sched):
    sched.pins.budget = 60
    a, b, c = (sched.sessions.open(None, 0) for _ in range(3))
    first_a, _ = _turn(sched, _ids(61, 20), SessionParams(id=a))
    _turn(sched, _ids(62, 20), SessionParams(id=b))
    assert sched.memory_accounting()["pinned"] == 54  # 2 x (20 prompt + 8 output - 1)
    _turn(sched, _ids(63, 20), SessionParams(id=c))  # 81 > 60: the oldest pin (a) goes
    assert sched.pins.keys() == [f"session:{b}", f"session:{c}"]
    assert sched.memory_accounting()["pinned"] == 54
    # a stays open without its pin; its next turn pins 28 + 3 + 8 - 1 = 38 tokens, and
    # 38 + 54 > 60 releases b, then c (least recently used first)
    _turn(sched, _ids(64, 3), SessionParams(id=a, rid=first_a.rid))
    assert sched.pins.keys() == [f"session:{a}"]
    assert sched.memory_accounting()["pinned"] == 38
    assert {a, b, c} <= set(sched.sessions.sessions)
