"""`plan capacity --hicache-bytes` against the engine: idle sessions held by both tiers.

Twelve sessions with disjoint 64-token histories run one after another on a 256-token
pool with a 384-token disk tier (page size 16); afterwards the sessions whose whole
history is still cached in either tier are counted and must equal the planner's `held`
(write_back: pool + tier; write_through: the tier's copies include the pool's).
"""

from __future__ import annotations

import json
import random

import pytest

from radixlm import Engine
from radixlm.plan.cli import main as plan_main
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool, make_req, run_all

SESSIONS, HISTORY, POOL, TIER, PAGE = 12, 64, 256, 384, 16


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_engine_holds_the_planned_idle_sessions(policy, tmp_path, capsys):
    rng = random.Random(0)
    histories = [rng.sample(range(100, 20000), HISTORY) for _ in range(SESSIONS)]
    kw = dict(hicache_tier="disk", hicache_size=str(TIER), hicache_dir=str(tmp_path))
    with Engine(
        MODEL, max_total_tokens=POOL, page_size=PAGE, hicache_write_policy=policy, **kw
    ) as engine:
        sched = engine.scheduler
        bpt = engine.runner.kv_bytes_per_token
        for ids in histories:  # one token out: the cached history is the 64-token prompt
            sched.add_request(make_req(ids, 1, ignore_eos=True))
            run_all(sched)
            check_pool(sched, idle=True)
        held = []
        for i, ids in enumerate(histories):
            _, primary, tier = sched.tree._match(ids, None)
            if sum(len(n.key) for n in primary + tier) == HISTORY:
                held.append(i)
    argv = ["capacity", "--model", MODEL, "--dtype", "fp32", "--kv-dtype", "fp32", "--tp", "1"]
    argv += ["--kv-budget-bytes", str(POOL * bpt), "--page-size", str(PAGE)]
    argv += ["--hicache-bytes", str(TIER * bpt), "--session-history", str(HISTORY)]
    assert plan_main([*argv, "--hicache-write-policy", policy, "--json"]) == 0
    (plan,) = json.loads(capsys.readouterr().out)["idle_sessions"]
    assert (plan["primary_sessions"], plan["tier_sessions"]) == (4, 6)
    assert plan["held_sessions"] == (10 if policy == "write_back" else 6)
    assert held == list(range(SESSIONS - plan["held_sessions"], SESSIONS))  # the latest
