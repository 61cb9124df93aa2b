"""The SLO scheduler's step-time model (`runtime/sched/step_model.py`): exact recovery of a
linear step-time function, and non-negative coefficients where noise and correlated
features would make an unconstrained fit negative."""

from __future__ import annotations

import numpy as np
import pytest

from radixlm.runtime.sched.step_model import StepTimeModel


def test_recovers_an_exact_linear_step_time():
    model = StepTimeModel(prior=(1.0, 1.0, 1.0))
    for chunk, batch in [(0, 1), (512, 0), (256, 8), (128, 32), (0, 16), (64, 4)]:
        model.observe(chunk, batch, 20.0 + 0.5 * chunk + 2.0 * batch)
    a, b, c = model.theta
    assert (a, b, c) == pytest.approx((20.0, 0.5, 2.0), rel=1e-5)
    assert model.predict_ms(100, 10) == pytest.approx(20.0 + 50.0 + 20.0, rel=1e-5)
    assert model.largest_prefill(120.0, 10, cap=8192) == 160


def test_coefficients_stay_nonnegative_on_correlated_noisy_steps():
    # Steps where the decode batch shrinks as the prefill grows (a chunk admitted while
    # others finish), with a decode cost of zero and noise: the unconstrained least
    # squares answer has c < 0; the model must keep c >= 0 and still fit b.
    rng = np.random.default_rng(0)
    chunks = rng.integers(0, 512, size=64)
    batches = 32 - chunks // 16
    times = 50.0 + 0.4 * chunks + rng.normal(0.0, 15.0, size=64)
    x = np.stack([np.ones(64), chunks, batches], axis=1).astype(float)
    free = np.linalg.lstsq(x, times, rcond=None)[0]
    assert free[2] < 0  # the case the constraint is for
    model = StepTimeModel()
    for chunk, batch, ms in zip(chunks, batches, times):
        model.observe(int(chunk), int(batch), float(ms))
    a, b, c = model.theta
    assert min(a, b, c) >= 0.0
    assert b == pytest.approx(0.4, abs=0.05)
    assert model.largest_prefill(250.0, 16, cap=8192) < 8192
