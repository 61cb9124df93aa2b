"""Tiny random-initialised Llama-family models (untied head, QKV bias, Llama's q/k/v/o
attention_bias, RoPE scaling) saved as Hugging Face directories: greedy output equals
transformers token for token."""

from __future__ import annotations

import pytest

from radixlm import Engine
from tests.runtime.conftest import hf_greedy
from tests.tiny_models import save_random_model, tiny_config


def _tiny(kind: str):
    if kind == "qwen2":
        return tiny_config("qwen2")
    if kind == "llama-attn-bias":  # biases on q/k/v and o: the C decode stack steps aside
        return tiny_config("llama", tie_word_embeddings=False, attention_bias=True)
    if kind == "llama3-rope":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return tiny_config("llama", tie_word_embeddings=False, rope_parameters=rope)
    return tiny_config("llama")


# "auto" on CPU: packed weights, C kernels and the fused decode layer; "torch": torch's
# GEMM and the torch_native backend (the reference path).
CPU_PATHS = {
    "auto": {},
    "torch": {"cpu_gemm": "torch", "attention_backend": "torch_native"},
}


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
@pytest.mark.parametrize("kind", ["llama-tied", "qwen2", "llama3-rope", "llama-attn-bias"])
def test_tiny_model_matches_transformers(kind, path, tmp_path, hf_dir):
    model = save_random_model(_tiny(kind), tmp_path, hf_dir)
    prompts = [[5, 17, 300, 4000, 9], [77] * 30 + [123, 456], list(range(100, 200))]
    refs = hf_greedy(model, prompts, 12, eos_token_id=None)
    with Engine(str(tmp_path), max_total_tokens=1024, page_size=4, **CPU_PATHS[path]) as engine:
        params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in outs] == refs
