"""The planner's roofline as a linear step-time model: the prior of the scheduler's online
model under SLO scheduling (`radixlm/runtime/sched/step_model.py`, docs/slo.md).

The scheduler models a step as  t_ms = a + b * prefill_tokens + c * decode_batch.  The
roofline of `cost.Deployment.step` is piecewise linear in those (a max of a compute and
a memory line, plus attention terms); its least-squares linear fit over the operating
range -- chunks of 0..`max_chunk` tokens (each at the start of its prompt) next to
0..`max_batch` decodes at `context` tokens -- is the prior. It is a starting point that
the measured steps replace, so the fit's error at the corners of the grid is acceptable.
"""

from __future__ import annotations

import logging

import numpy as np

from radixlm.plan.cost import Deployment
from radixlm.plan.hardware import get_hardware
from radixlm.plan.models import load_model

logger = logging.getLogger(__name__)

#: radixlm's --dtype / --kv-cache-dtype names -> the planner's.
_DTYPES = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}


def linear_step_prior(
    dep: Deployment, context: int = 1024, max_chunk: int = 2048, max_batch: int = 64
) -> tuple[float, float, float]:
    """(a, b, c): ms per step, per prefill token, per decoding request, fitted to
    `dep.step` on an 8 x 8 grid of chunk sizes and decode batches (module doc)."""
    rows, times = [], []
    for chunk in np.linspace(0, max_chunk, 8).astype(int):
        for batch in np.linspace(0, max_batch, 8).astype(int):
            if chunk == 0 and batch == 0:
                continue
            step = dep.step(decode_batch=int(batch), context=context, chunk=int(chunk))
            rows.append((1.0, float(chunk), float(batch)))
            times.append(step.time_s * 1e3)
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)
    a, b, c = (max(float(v), 0.0) for v in coef)
    return a, b, c


def serving_step_prior(
    model: str, device: str, dtype: str, kv_dtype: str, gpu_name: str | None
) -> str | None:
    """`--slo-step-prior` for a server: ``"a,b,c"`` from the roofline of `model` on this
    device (`gpu_name` on CUDA, else the measured CPU), or None (logged) when the planner
    does not know the model or the GPU."""
    try:
        spec = load_model(model)
        hw = get_hardware(gpu_name if device == "cuda" and gpu_name else "cpu")
        weight = _DTYPES[dtype]
        kv = weight if kv_dtype == "auto" else _DTYPES[kv_dtype]
        a, b, c = linear_step_prior(Deployment(spec, hw, weight_dtype=weight, kv_dtype=kv))
    except Exception as exc:  # the prior is optional: the model fits from measured steps
        logger.warning("no planner prior for the SLO step-time model: %s", exc)
        return None
    return f"{a:.6g},{b:.6g},{c:.6g}"
