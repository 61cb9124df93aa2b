"""Shared fixtures for the planner tests: preset specs and a fixed fake CPU."""

from __future__ import annotations

import pytest

from radixlm.plan.hardware import GPUS, Hardware
from radixlm.plan.models import PRESETS, spec_from_config

# The bundled SmolLM2-135M's config (DESIGN.md section 10), so unit tests need no model file.
SMOLLM2_CONFIG = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


@pytest.fixture(scope="session")
def specs():
    out = {name: spec_from_config(cfg, name) for name, cfg in PRESETS.items()}
    out["smollm2"] = spec_from_config(SMOLLM2_CONFIG, "smollm2")
    return out


@pytest.fixture(scope="session")
def h100() -> Hardware:
    return GPUS["H100-SXM"]


@pytest.fixture(scope="session")
def fake_cpu() -> Hardware:
    """A deterministic stand-in for the measured CPU: 80 GFLOP/s, 20 GB/s, 32 GB."""
    return Hardware(
        "cpu",
        32e9,
        20e9,
        {p: 80e9 for p in ("fp32", "bf16", "fp8", "int8")},
        0.0,
        "fake",
        measured=True,
    )
