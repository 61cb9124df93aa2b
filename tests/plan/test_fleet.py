"""Fleet sizing chain."""

from __future__ import annotations

import math

import pytest

from radixlm.plan.cost import Deployment
from radixlm.plan.fleet import plan_fleet, plan_replica
from radixlm.plan.lengths import LengthDist


def test_length_dist_parse():
    d = LengthDist.parse("128:3,2048:1")
    assert d.mean == pytest.approx(128 * 0.75 + 2048 * 0.25)
    assert d.max == 2048
    assert LengthDist.parse("512").mean == 512
    with pytest.raises(ValueError):
        LengthDist.parse("0")


def _kwargs(**over):
    kw = dict(
        rate=10_000.0,
        prompt=LengthDist.parse("1024"),
        output=LengthDist.parse("256"),
        ttft_slo_ms=2000,
        tpot_slo_ms=50,
    )
    kw.update(over)
    return kw


def test_replica_chain_is_consistent(h100, specs):
    dep = Deployment(specs["Llama-3-70B"], h100, tp=8)
    plan = plan_replica(dep, **_kwargs())
    assert plan.feasible and plan.tpot_ms <= 50
    assert plan.replicas == math.ceil(10_000 / (0.8 * plan.replica_rps))
    assert plan.gpus == 8 * plan.replicas and plan.nodes == plan.replicas
    assert [c["step"] for c in plan.chain][:2] == ["lengths", "weights/GPU"]


def test_fleet_picks_fewest_gpus(h100, specs):
    deps = [Deployment(specs["Llama-3-70B"], h100, tp=tp) for tp in (1, 2, 4, 8)]
    best, plans = plan_fleet(deps, **_kwargs())
    assert not plans[0].feasible  # 141 GB of weights on one 80 GB GPU
    assert best.gpus == min(p.gpus for p in plans if p.feasible)


def test_rate_scales_replicas(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    small = plan_replica(dep, **_kwargs(rate=100.0))
    big = plan_replica(dep, **_kwargs(rate=10_000.0))
    assert big.replica_rps == small.replica_rps  # per-replica throughput is rate-free
    assert 100 * (small.replicas - 1) < big.replicas <= 100 * small.replicas


def test_prefix_hits_reduce_fleet(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    cold = plan_replica(dep, **_kwargs(prompt=LengthDist.parse("8192")))
    warm = plan_replica(dep, **_kwargs(prompt=LengthDist.parse("8192"), prefix_hit=0.9))
    assert warm.replicas < cold.replicas


def test_ttft_infeasible(h100, specs):
    dep = Deployment(specs["Llama-3-70B"], h100, tp=2)
    plan = plan_replica(
        dep, **_kwargs(prompt=LengthDist.parse("512:0.99,32768:0.01"), ttft_slo_ms=100)
    )
    assert not plan.feasible


def test_replica_spanning_nodes_counts_every_node(h100, specs):
    dep = Deployment(specs["Llama-3-70B"], h100, tp=8)
    plan = plan_replica(dep, **_kwargs(gpus_per_node=4))
    assert plan.feasible
    assert plan.nodes == 2 * plan.replicas  # 8 GPUs per replica over 4-GPU nodes
    assert plan.gpus == 4 * plan.nodes
