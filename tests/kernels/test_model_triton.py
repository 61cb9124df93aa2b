"""The whole engine on a 2-layer random-initialised Llama with the Triton backend (run by the
interpreter on CPU) reproduces the torch_native backend's greedy tokens, cache hits included."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixlm import Engine
from tests.runtime.conftest import hf_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, hf_dir):  # noqa: F811
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # larger weights than the default init make logits less flat
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, path / name)
    return path


def _generate(path, backend: str) -> list[list[int]]:
    prompts = [[5, 17, 300, 4000, 9], [77] * 30 + [123, 456], list(range(100, 140))]
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    args = dict(max_total_tokens=1024, page_size=16, attention_backend=backend)
    with Engine(str(path), **args) as engine:
        assert engine.runner.attention_backend == backend
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        # A second round extends cached prefixes (prefix lengths 32 and 40).
        again = [prompts[1] + [9, 10, 11], prompts[2] + [1000]]
        outs += engine.generate(input_ids=again, sampling_params=params)
    return [o["output_ids"] for o in outs]


def test_triton_engine_matches_torch_native(tiny_llama, device):
    if device != "cpu":
        pytest.skip("the CPU interpreter run; GPU agreement is in test_gpu.py")
    assert _generate(tiny_llama, "triton") == _generate(tiny_llama, "torch_native")
