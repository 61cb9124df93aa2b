"""The second KV tier in the scheduler: multi-turn agent sessions whose whole history is
evicted from the primary pool between turns come back from the tier.

Each session's turn k prompt is its turn k-1 prompt + answer + a new message; turns run
one request at a time, so the same prefix reaches the same kernels with or without the
tier: greedy tokens and their logprobs must be equal (the disk and host tiers are
lossless), and `cached_tokens` must equal what a pool large enough to never evict reuses.
"""

from __future__ import annotations

import random

import pytest

from radixlm import Engine
from radixlm.frontend.metrics import ServerMetrics
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool, make_req, run_all, tokens
from tests.tiny_models import save_random_model, tiny_config

SESSIONS, TURNS, SYSTEM, MSG, NEW = 3, 3, 40, 8, 6


def _messages(seed: int = 0) -> tuple[list[list[int]], list[list[list[int]]]]:
    rng = random.Random(seed)
    ids = range(100, 20000)
    systems = [rng.sample(ids, SYSTEM) for _ in range(SESSIONS)]
    return systems, [[rng.sample(ids, MSG) for _ in range(TURNS)] for _ in range(SESSIONS)]


def _run_sessions(engine: Engine, evict: bool, before_turn=None) -> list[tuple]:
    """(tokens, logprobs, cached_tokens) per request in turn order; with `evict` the
    primary pool drops every cached prefix after each request. `before_turn(t)` runs
    before turn t's requests."""
    sched = engine.scheduler
    systems, msgs = _messages()
    history = [list(s) for s in systems]
    results = []
    for turn in range(TURNS):
        if before_turn is not None:
            before_turn(turn)
        for s in range(SESSIONS):
            req = make_req(history[s] + msgs[s][turn], NEW, ignore_eos=True)
            req.return_logprob = True
            sched.add_request(req)
            outs = run_all(sched)[req.rid]
            out = tokens(outs)
            lps = [lp for o in outs if o.output_logprobs for lp in o.output_logprobs.logprobs]
            results.append((out, lps, req.cached_tokens))
            history[s] = req.input_ids + out
            check_pool(sched, idle=True)
            if evict:
                sched.tree.evict(sched.tree.evictable_size())
                assert sched.tree.evictable_size() == 0
                check_pool(sched, idle=True)
    return results


@pytest.fixture(scope="module")
def references() -> dict[int, list[tuple]]:
    """Per page size: the sessions on a pool that never evicts, without a tier."""
    refs = {}
    for ps in (1, 16):
        with Engine(MODEL, max_total_tokens=4096, page_size=ps) as engine:
            refs[ps] = _run_sessions(engine, evict=False)
    return refs


def _later_turns_cached(results: list[tuple]) -> int:
    return sum(c for _, _, c in results[SESSIONS:])


@pytest.mark.parametrize(
    "page_size,tier,policy",
    [(1, "disk", "write_through"), (1, "host", "write_back"), (16, "disk", "write_back")],
)
def test_history_evicted_every_turn_comes_back_from_the_tier(
    references, page_size, tier, policy, tmp_path
):
    kw = dict(hicache_tier=tier, hicache_write_policy=policy, hicache_dir=str(tmp_path))
    with Engine(MODEL, max_total_tokens=128, page_size=page_size, **kw) as engine:
        got = _run_sessions(engine, evict=True)
        stats = engine.scheduler.stats()
        info = engine.get_server_info()
        assert engine.flush_cache()
        assert engine.scheduler.tree.tier_accounting()["tier_used"] == 0
    assert info["hicache"]["tier"] == tier and info["memory"]["tier_total"] == 256
    assert info["hicache"]["tier_tokens_loaded"] == stats["tier_tokens_loaded"]
    text = ServerMetrics().render(stats).decode()
    assert "radixlm:hicache_capacity_tokens 256.0" in text
    assert f"radixlm:hicache_loaded_tokens_total {float(stats['tier_tokens_loaded'])}" in text
    ref = references[page_size]
    assert [r[0] for r in got] == [r[0] for r in ref]  # greedy tokens
    assert [r[1] for r in got] == [r[1] for r in ref]  # logprobs, exactly: lossless tier
    assert [r[2] for r in got] == [r[2] for r in ref]  # cached_tokens counts tier hits
    hits = _later_turns_cached(ref)
    assert hits >= (TURNS - 1) * SESSIONS * SYSTEM // 2
    assert stats["tier_hit_tokens"] == stats["tier_tokens_loaded"] == hits
    assert stats["cached_tokens_total"] == hits
    assert stats["tier_bytes_loaded"] == hits * stats["tier_bytes_per_token"]
    assert stats["tier_load_seconds"] > 0 and stats["tier_corrupt_pages"] == 0
    assert stats["tier_total"] == 256 and stats["tier_used"] > 0


def test_without_tier_the_evicted_history_is_recomputed(references):
    with Engine(MODEL, max_total_tokens=128) as engine:
        got = _run_sessions(engine, evict=True)
        assert "tier_total" not in engine.scheduler.memory_accounting()
    assert [r[0] for r in got] == [r[0] for r in references[1]]
    assert all(c == 0 for _, _, c in got)


def test_corrupted_tier_file_is_recomputed_not_served(references, tmp_path):
    def corrupt(turn: int) -> None:
        if turn == 1:  # every page the first turns wrote
            with open(tier.path, "r+b") as f:
                f.write(b"\x5a" * tier.data.numel())

    kw = dict(hicache_tier="disk", hicache_dir=str(tmp_path))
    with Engine(MODEL, max_total_tokens=128, **kw) as engine:
        tier = engine.scheduler.tree.tier
        got = _run_sessions(engine, evict=True, before_turn=corrupt)
        stats = engine.scheduler.stats()
    ref = references[1]
    assert [r[0] for r in got] == [r[0] for r in ref]
    assert [r[2] for r in got[SESSIONS : 2 * SESSIONS]] == [0] * SESSIONS  # recomputed
    assert [r[2] for r in got[2 * SESSIONS :]] == [r[2] for r in ref[2 * SESSIONS :]]
    assert stats["tier_corrupt_pages"] >= SESSIONS and stats["tier_dropped_tokens"] > 0


def test_tiny_random_model_with_tier(tmp_path, hf_dir):
    path = tmp_path / "model"
    save_random_model(tiny_config("qwen2"), path, hf_dir)
    with Engine(str(path), max_total_tokens=4096, page_size=16) as engine:
        ref = _run_sessions(engine, evict=False)
    kw = dict(hicache_tier="disk", hicache_dir=str(tmp_path / "tier"), page_size=16)
    with Engine(str(path), max_total_tokens=128, **kw) as engine:
        got = _run_sessions(engine, evict=True)
    assert [r[0] for r in got] == [r[0] for r in ref]
    assert [r[1] for r in got] == [r[1] for r in ref]
    assert [r[2] for r in got] == [r[2] for r in ref] and _later_turns_cached(ref) > 0
