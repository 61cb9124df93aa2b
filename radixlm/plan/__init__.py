"""Analytic serving planner (`radixlm plan`): KV size, capacity, roofline, speculation,
chunked-prefill budget, disaggregation, fleet sizing and MoE bills from a model config.

Pure functions live in one module per concern (models, hardware, kv, weights, capacity,
cost, roofline, spec, chunk, disagg, lengths, fleet, moe); `cli` wires them to argparse and
`report` prints tables or JSON. Every formula's docstring gives its derivation and
source.
"""

from __future__ import annotations

from radixlm.plan.cost import Deployment
from radixlm.plan.hardware import GPUS, Hardware, get_hardware
from radixlm.plan.kv import kv_bytes_per_token
from radixlm.plan.models import PRESETS, ModelSpec, load_model, spec_from_config

__all__ = [
    "GPUS",
    "PRESETS",
    "Deployment",
    "Hardware",
    "ModelSpec",
    "get_hardware",
    "kv_bytes_per_token",
    "load_model",
    "spec_from_config",
]
