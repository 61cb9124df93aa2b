"""Disaggregation: transfer vs prefill vs interference, and the pool ratio."""

from __future__ import annotations

import pytest

from radixlm.plan.cost import Deployment
from radixlm.plan.disagg import plan_disagg


def test_transfer_and_break_even(h100, specs):
    dep = Deployment(specs["Llama-3-70B"], h100, tp=4)
    link = 50e9  # 400 Gbit/s
    p = plan_disagg(dep, prompt=4096, output=256, link_bandwidth=link, tpot_slo_ms=50)
    assert p.kv_bytes_per_request == 4096 * 327_680
    assert p.kv_bytes_per_gpu == 4096 * 327_680 / 4
    assert p.transfer_ms == pytest.approx(4096 * 81_920 / link * 1e3)
    assert p.break_even_bandwidth == pytest.approx(p.kv_bytes_per_gpu / (p.prefill_ms / 1e3))
    assert p.transfer_hidden_by_prefill == (link >= p.break_even_bandwidth)


def test_interference_and_ratio(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    p = plan_disagg(dep, prompt=8192, output=512, link_bandwidth=50e9, tpot_slo_ms=50)
    assert p.stall_ms == pytest.approx(p.mixed_step_ms - p.decode_ms)
    assert not p.colocated_meets_tpot  # an 8k prefill dwarfs a 50 ms step budget
    assert p.prefill_to_decode_ratio == pytest.approx(
        p.decode_rps_per_instance / p.prefill_rps_per_instance
    )


def test_slow_link_does_not_pay(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    p = plan_disagg(dep, prompt=1024, output=128, link_bandwidth=0.1e9, tpot_slo_ms=50)
    assert not p.transfer_hidden_by_prefill and not p.disagg_pays_on_latency
