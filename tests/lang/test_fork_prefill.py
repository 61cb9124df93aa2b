"""Fork-aware prefill on the in-process Engine: a fork's shared prefix is computed once
(the commit before the fork) and its branches' suffixes together in one extend step."""

from __future__ import annotations

import pytest

import radixlm as rl

N = 4
PREFIX = (
    "You are a careful assistant. "
    + " ".join(f"Fact {i}: the value of item {i} is {i * 7}." for i in range(20))
    + "\n"
)


def _suffix(i: int) -> str:
    return f"Question {i}: what is item {i} worth? Answer:"


@rl.function
def branching(s):
    s += PREFIX
    forks = s.fork(N)
    forks += _suffix
    for f in forks:
        f += rl.gen("answer", max_tokens=3, temperature=0)
    forks.join()


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture
def gathering(engine_backend):
    """The backend with a long gather window: the branches' threads may start far apart
    on a loaded machine, and the hold ends as soon as all of them have sent."""
    driver = engine_backend._driver
    saved, driver.gather_s = driver.gather_s, 30.0
    yield engine_backend
    driver.gather_s = saved


def test_fork_prefills_prefix_once_and_branches_in_one_step(gathering):
    backend = gathering
    assert backend.flush_cache()
    tok = backend.engine_call(lambda e: e.tokenizer)
    prefix = tok.encode(PREFIX, add_special_tokens=False)
    branches = [tok.encode(PREFIX + _suffix(i), add_special_tokens=False) for i in range(N)]
    suffixes = sum(len(b) - _common(b, prefix) for b in branches)
    chunk = backend.engine_call(lambda e: e.scheduler.step_prefill_tokens)
    assert chunk is None or max(len(prefix), suffixes) <= chunk  # no prompt is split

    def counters(engine):
        c = engine.scheduler.counters
        return c.prefill_tokens, c.extend_steps

    before = backend.engine_call(counters)
    state = branching.run(backend=backend)
    assert len(state["answer"]) == N
    prefill, extends = (a - b for a, b in zip(backend.engine_call(counters), before))
    assert prefill == len(prefix) + suffixes  # not N * len(prefix)
    assert extends == 2  # the commit, then all N branches' suffixes in one step
