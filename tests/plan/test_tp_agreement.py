"""The planner against radixlm's own engine under tensor parallelism (slow).

For SmolLM2-135M at --tp-size 1 and 3 (its 9 heads do not split in 2) and a tiny Llama at
--tp-size 2: `plan capacity`, given the engine's per-rank KV budget, gives the engine's
token capacity and per-rank KV bytes per token; and, given the same per-rank memory
budget (memory x mem_fraction) as the engine had, its token capacity and per-rank
weights within 1%.
"""

from __future__ import annotations

import json

import pytest

from radixlm import Engine
from radixlm.plan.capacity import capacity
from radixlm.plan.cli import main as plan_main
from radixlm.plan.hardware import Hardware
from radixlm.plan.models import load_model
from radixlm.plan.weights import weights_bytes
from radixlm.runtime import local_hf_dir
from radixlm.runtime.executor.memory import available_memory_bytes
from tests.tiny_models import save_random_model, tiny_config

pytestmark = pytest.mark.slow

PAGE = 4
KV_TARGET = 64e6  # bytes of KV per rank the memory fraction is chosen to leave
# The packed CPU layout's second copies of SmolLM2's 49152 x 576 head at --tp-size 1
# (the packed panels, the greedy screen's half-size copy and its two factors per row);
# tensor-parallel ranks run plain torch layers and keep none.
HEAD_COPIES = 49152 * 576 * 4 + 49152 * 576 * 2 + 2 * 49152 * 4


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("llama")
    save_random_model(tiny_config("llama"), path, local_hf_dir("smollm2-135m"))
    return str(path)


@pytest.mark.parametrize(("which", "tp"), [("smollm2", 1), ("smollm2", 3), ("llama", 2)])
def test_plan_capacity_matches_engine_per_rank(which, tp, tiny_llama, capsys):
    model = "smollm2-135m" if which == "smollm2" else tiny_llama
    spec = load_model(model)
    copies = HEAD_COPIES if tp == 1 else 0
    per_rank = available_memory_bytes() / tp  # the engine's CPU budget is per rank
    fraction = (weights_bytes(spec, "fp32") / tp + copies + KV_TARGET) / per_rank
    if not 0 < fraction < 1:
        pytest.skip("not enough free memory")
    with Engine(
        model, tp_size=tp, mem_fraction=fraction, page_size=PAGE, weight_format="fp32"
    ) as e:
        info = e.get_server_info()
    assert (
        plan_main(
            [
                "capacity",
                "--model",
                model,
                "--kv-dtype",
                "fp32",
                "--kv-budget-bytes",
                str(info["kv_budget_bytes"]),
                "--page-size",
                str(PAGE),
                "--tp",
                str(tp),
                "--json",
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["max_tokens"] == info["max_total_tokens"]
    assert row["kv_bytes_per_token_per_gpu"] == info["kv_bytes_per_token"]
    if tp == 1:
        return
    # The same per-rank memory budget: what the engine gave weights plus KV, / fraction.
    memory = (info["kv_budget_bytes"] + info["weights_bytes"]) / fraction
    hw = Hardware("this host, per rank", memory_bytes=memory, mem_bandwidth=1.0)
    plan = capacity(
        spec,
        hw,
        tp=tp,
        weight_dtype="fp32",
        kv_dtype="fp32",
        mem_fraction=fraction,
        page_size=PAGE,
    )
    assert plan.kv_bytes_per_token_per_gpu == info["kv_bytes_per_token"]
    assert plan.weights_bytes_per_gpu == pytest.approx(info["weights_bytes"], rel=0.01)
    assert plan.max_tokens == pytest.approx(info["max_total_tokens"], rel=0.01)
