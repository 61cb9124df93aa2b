"""The planner's roofline as the SLO scheduler's prior: the linear fit recovers a linear
step time exactly, and the serving prior is the fit of the model's roofline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixlm.plan.cost import Deployment
from radixlm.plan.hardware import get_hardware
from radixlm.plan.models import load_model
from radixlm.plan.step_prior import linear_step_prior, serving_step_prior


class LinearDeployment:
    def step(self, decode_batch=0, context=0, chunk=0, chunk_prefix=0, chunk_seqs=1):
        return SimpleNamespace(time_s=(3.0 + 0.02 * chunk + 0.4 * decode_batch) / 1e3)


def test_linear_step_time_is_recovered():
    assert linear_step_prior(LinearDeployment()) == pytest.approx((3.0, 0.02, 0.4))


def test_serving_prior_is_the_roofline_fit():
    dep = Deployment(load_model("smollm2-135m"), get_hardware("H100-SXM"))
    a, b, c = linear_step_prior(dep)
    got = serving_step_prior("smollm2-135m", "cuda", "bfloat16", "auto", "H100 SXM")
    assert [float(v) for v in got.split(",")] == pytest.approx([a, b, c], rel=1e-5)
    assert serving_step_prior("no-such-model", "cpu", "float32", "auto", None) is None
