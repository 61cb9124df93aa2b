"""The whole engine on a 2-layer random-initialised Llama with the Triton backend (run by the
interpreter on CPU) reproduces the torch_native backend's greedy tokens, cache hits included."""

from __future__ import annotations

import pytest

from radixlm import Engine
from tests.kernels.cases import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, hf_dir):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), hf_dir, head_dim=16)


def generate(path, backend: str, **server_args) -> list[list[int]]:
    """Greedy tokens of three prompts, then of two prompts extending cached prefixes."""
    prompts = [[5, 17, 300, 4000, 9], [77] * 30 + [123, 456], list(range(100, 140))]
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    args = dict(max_total_tokens=1024, page_size=16, attention_backend=backend, **server_args)
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
    assert generate(tiny_llama, "triton") == generate(tiny_llama, "torch_native")
