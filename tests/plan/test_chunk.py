"""Chunked-prefill budget under a TPOT and a TTFT SLO."""

from __future__ import annotations

from radixlm.plan.chunk import plan_chunk, ttft_ms, worst_step_ms
from radixlm.plan.cost import Deployment


def test_feasible_plan_meets_both_slos(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    plan = plan_chunk(
        dep, decode_batch=32, context=2048, prompt=8192, tpot_slo_ms=30, ttft_slo_ms=1000
    )
    assert plan.feasible
    assert plan.min_chunk <= plan.recommended_chunk <= plan.max_chunk
    assert plan.itl_ms <= 30 and plan.ttft_ms <= 1000
    assert plan.recommended_chunk % 64 == 0
    assert plan.token_budget == 32 + plan.recommended_chunk
    # max_chunk is tight: one more token breaks TPOT
    assert worst_step_ms(dep, 32, 2048, 8192, plan.max_chunk + 1) > 30


def test_tight_tpot_is_infeasible(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    plan = plan_chunk(
        dep, decode_batch=64, context=2048, prompt=4096, tpot_slo_ms=1, ttft_slo_ms=1000
    )
    assert not plan.feasible and plan.max_chunk == 0 and plan.recommended_chunk is None


def test_conflicting_slos(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    plan = plan_chunk(
        dep, decode_batch=32, context=2048, prompt=32768, tpot_slo_ms=8, ttft_slo_ms=600
    )
    assert not plan.feasible
    assert plan.min_chunk is None or plan.min_chunk > plan.max_chunk


def test_ttft_falls_with_chunk(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    assert ttft_ms(dep, 16, 1024, 4096, 256) > ttft_ms(dep, 16, 1024, 4096, 2048)


def test_small_chunks_below_alignment(fake_cpu, specs):
    # On a CPU the TPOT budget admits only a few dozen prefill tokens per step.
    dep = Deployment(specs["smollm2"], fake_cpu, weight_dtype="fp32", kv_dtype="fp32")
    plan = plan_chunk(
        dep, decode_batch=4, context=256, prompt=512, tpot_slo_ms=100, ttft_slo_ms=5000
    )
    assert 0 < plan.max_chunk < 64
    assert plan.feasible and plan.recommended_chunk == plan.max_chunk
    assert plan.itl_ms <= 100 and plan.ttft_ms <= 5000
