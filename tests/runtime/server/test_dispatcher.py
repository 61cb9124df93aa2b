"""Dispatch policies (runtime/server/dispatcher.py) and the replica set's routing and
info merge (runtime/server/replicas.py), without processes."""

from __future__ import annotations

import pytest

from radixlm.runtime.sched.sessions import SessionParams
from radixlm.runtime.server.dispatcher import CacheAware, LeastLoad, RoundRobin, make_policy
from radixlm.runtime.server.replicas import ReplicaSet


def test_round_robin_cycles_through_candidates():
    p = RoundRobin(3)
    loads = [0, 0, 0]
    assert [p.choose([1], (0, 1, 2), loads) for _ in range(4)] == [0, 1, 2, 0]
    # A missing candidate is skipped, the cycle continues after the last choice.
    assert [p.choose([1], (0, 2), loads) for _ in range(3)] == [2, 0, 2]


def test_least_load_picks_fewest_in_flight_lowest_rank_on_ties():
    p = LeastLoad(3)
    assert p.choose([1], (0, 1, 2), [2, 1, 1]) == 1
    assert p.choose([1], (0, 2), [2, 1, 1]) == 2
    with pytest.raises(ValueError, match="no replica"):
        p.choose([1], (), [0, 0, 0])


def test_cache_aware_follows_the_longest_prefix():
    p = CacheAware(2, balance_threshold=4)
    system = list(range(100, 140))
    first = p.choose(system + [1, 2], (0, 1), [0, 0])
    assert first == 0  # empty trees: tie on match and load -> lowest rank
    # An unrelated prompt (0 tokens matched anywhere) goes to the smaller tree at equal load.
    assert p.choose([7, 8, 9], (0, 1), [0, 0]) == 1
    # ... and to the less loaded replica before the smaller tree.
    assert p.choose([6, 6], (0, 1), [1, 0]) == 1
    # The shared-prefix follow-up goes back to replica 0 though replica 1 is less loaded.
    assert p.choose(system + [3, 4], (0, 1), [1, 0]) == 0
    assert p.matched(0, system + [5]) == len(system) + 0
    assert p.matched(1, system + [5]) == 0
    # A namespace (cache salt) never matches another namespace's prefixes.
    assert p.matched(0, system, "salt") == 0


def test_cache_aware_falls_back_to_least_load_when_imbalanced():
    p = CacheAware(2, balance_threshold=2)
    key = list(range(50))
    assert p.choose(key, (0, 1), [0, 0]) == 0
    assert p.choose(key, (0, 1), [2, 0]) == 0  # imbalance 2 is not past the threshold
    assert p.choose(key, (0, 1), [3, 0]) == 1  # 3 > 2: least loaded
    assert p.matched(1, key) == 50  # the routed key entered replica 1's tree


def test_cache_aware_tree_is_bounded_and_lru_trimmed():
    p = CacheAware(1, max_tree_tokens=10)
    p.choose([1, 2, 3, 4, 5, 6], (0,), [0])
    p.choose([9, 8, 7, 6, 5, 4], (0,), [0])  # 12 tokens > 10: the older leaf goes
    assert p.tree_tokens(0) == 6
    assert p.matched(0, [1, 2, 3]) == 0
    assert p.matched(0, [9, 8, 7]) == 3
    p.forget()
    assert p.tree_tokens(0) == 0


def test_make_policy_names_and_bad_values():
    assert isinstance(make_policy("cache_aware", 2), CacheAware)
    assert isinstance(make_policy("round_robin", 2), RoundRobin)
    assert isinstance(make_policy("least_load", 2), LeastLoad)
    with pytest.raises(ValueError, match="unknown dispatch policy 'random'"):
        make_policy("random", 2)
    with pytest.raises(ValueError, match="num_replicas"):
        RoundRobin(0)
    with pytest.raises(ValueError, match="balance_threshold"):
        CacheAware(2, balance_threshold=-1)


def test_replica_set_counts_loads_and_routes_sessions():
    rs = ReplicaSet(["ipc://a", "ipc://b"], RoundRobin(2))
    assert rs.route("r1", [1], None) == 0
    assert rs.route("r2", [1], None) == 1
    assert rs.loads == [1, 1] and rs.routed == [1, 1]
    rs.release("r1")
    rs.release("r1")  # a second release of the same id changes nothing
    assert rs.loads == [0, 1] and rs.rank_of("r1") is None and rs.rank_of("r2") == 1
    # A session opens on the least loaded replica; its turns follow it, whatever the policy.
    rank = rs.rank_for_new_session(None)
    assert rank == 0
    rs.bind_session("s", rank)
    assert [rs.route(f"t{i}", [1], None, SessionParams(id="s")) for i in range(3)] == [0, 0, 0]
    assert rs.rank_for_new_session("s") == 0  # a duplicate open goes where "s" lives
    rs.unbind_session("s")
    assert rs.session_rank("unknown") in (0, 1)


def _info(running, waiting, prompt, cached, total, free, evictable):
    stats = {
        "num_running": running,
        "num_waiting": waiting,
        "prompt_tokens_total": prompt,
        "cached_tokens_total": cached,
        "cache_hit_rate": cached / prompt,
        "token_usage": (total - free - evictable) / total,
        "new_token_ratio": 0.5,
        "total": total,
        "free": free,
        "evictable": evictable,
    }
    memory = {"total": total, "free": free, "evictable": evictable}
    sessions = {"open": 0}
    return {
        "num_running": running,
        "num_waiting": waiting,
        "scheduler": stats,
        "memory": memory,
        "sessions": sessions,
    }


def test_merge_infos_sums_counts_and_recomputes_rates():
    rs = ReplicaSet(["ipc://a", "ipc://b"], RoundRobin(2))
    rs.route("x", [1], None)
    merged = rs.merge_infos(
        [_info(1, 2, 100, 50, 1000, 800, 100), _info(3, 0, 300, 0, 1000, 500, 0)]
    )
    assert merged["dp_size"] == 2
    assert merged["num_running"] == 4 and merged["num_waiting"] == 2
    assert merged["memory"] == {"total": 2000, "free": 1300, "evictable": 100}
    assert merged["scheduler"]["cache_hit_rate"] == 50 / 400
    assert merged["scheduler"]["token_usage"] == (2000 - 1300 - 100) / 2000
    assert merged["scheduler"]["new_token_ratio"] == 0.5
    assert [
        (r["dp_rank"], r["num_running"], r["cache_hit_rate"], r["requests_routed"])
        for r in merged["replicas"]
    ] == [(0, 1, 0.5, 1), (1, 3, 0.0, 0)]
