"""Roofline: ridge point, decode knee, step times."""

from __future__ import annotations

import pytest

from radixlm.plan.cost import Deployment
from radixlm.plan.roofline import (
    decode_curve,
    decode_knee,
    knee_closed_form,
    plot_roofline,
    prefill_points,
    ridge_point,
)
from radixlm.plan.weights import weights_read_bytes


def test_h100_ridge(h100, specs):
    # 989.5 TFLOP/s / 3.35 TB/s
    assert ridge_point(Deployment(specs["Llama-3-8B"], h100)) == pytest.approx(295.4, abs=0.1)
    assert ridge_point(Deployment(specs["Llama-3-8B"], h100, weight_dtype="fp8")) == (
        pytest.approx(590.7, abs=0.1)
    )


def test_batch1_decode_is_weight_streaming(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    step = dep.decode(1, 0)
    assert step.bound == "memory"
    weights = weights_read_bytes(dep.model, 1, "bf16")
    assert step.time_s == pytest.approx((weights + 131_072) / 3.35e12)
    assert step.intensity == pytest.approx(1.0, abs=0.05)  # 2 FLOPs per 2-byte weight


def test_knee_numeric_matches_closed_form(h100, specs):
    for ctx in (0, 64, 256):
        dep = Deployment(specs["Llama-3-8B"], h100)
        closed = knee_closed_form(dep, ctx)
        assert closed is not None
        knee = decode_knee(dep, ctx)
        assert knee - 1 < closed <= knee  # smallest integer batch at or past the crossing


def test_short_context_knee_near_ridge(h100, specs):
    dep = Deployment(specs["Llama-3-70B"], h100, tp=8)
    knee = decode_knee(dep, 0)
    assert 0.9 * ridge_point(dep) < knee < 1.2 * ridge_point(dep)


def test_long_context_never_compute_bound(h100, specs):
    dep = Deployment(specs["Llama-3-8B"], h100)
    assert knee_closed_form(dep, 4096) is None
    assert decode_knee(dep, 4096) is None


def test_curve_monotone(h100, specs):
    curve = decode_curve(Deployment(specs["Llama-3-8B"], h100), 512)
    steps = [p.step_ms for p in curve]
    tps = [p.tokens_per_s for p in curve]
    assert steps == sorted(steps) and tps == sorted(tps)


def test_prefill_compute_bound_past_ridge(h100, specs):
    rows = prefill_points(Deployment(specs["Llama-3-8B"], h100), (64, 4096))
    assert rows[0]["bound"] == "memory" and rows[1]["bound"] == "compute"
    assert rows[1]["intensity"] > ridge_point(Deployment(specs["Llama-3-8B"], h100))


def test_moe_knee_needs_bigger_batch(h100, specs):
    dense = decode_knee(Deployment(specs["Llama-3-70B"], h100, tp=8), 0)
    moe = decode_knee(Deployment(specs["Mixtral-8x7B"], h100, tp=2), 0)
    assert moe > 3 * dense  # E/k = 4 times fewer reuses per expert weight


def test_tp_divides_step_time(h100, specs):
    one = Deployment(specs["Llama-3-8B"], h100).decode(1, 0).time_s
    two = Deployment(specs["Llama-3-8B"], h100, tp=2).decode(1, 0).time_s
    assert two == pytest.approx(one / 2)


def test_plot_optional(tmp_path, h100, specs):
    pytest.importorskip("matplotlib")
    dep = Deployment(specs["Llama-3-8B"], h100)
    path = plot_roofline(
        dep, 512, decode_curve(dep, 512), prefill_points(dep, (512,)), str(tmp_path / "r.png")
    )
    assert (tmp_path / "r.png").stat().st_size > 1000 and path.endswith("r.png")
