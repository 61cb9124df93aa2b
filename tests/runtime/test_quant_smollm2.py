"""The bundled SmolLM2-135M quantized in the test (compressed-tensors asymmetric W4A16 G=32 and W8A8
int8, tests/quant_checkpoints.py): radixlm loads it quantized and its greedy output agrees
with the fp32 model's over the first tokens."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.kernels.cpu import CpuKernels
from tests.quant_checkpoints import write_compressed_tensors

pytest.importorskip("compressed_tensors")

TEXTS = ["The capital of France is", "def fibonacci(n):"]
#: Tokens that must match the fp32 run: round-to-nearest int4 of a 135M model changes the
#: wording after the first token (" Paris." vs " Paris.\")"), int8 keeps it longer.
AGREE = {"w4a16_asym": 1, "w8a8_int8": 4}


@pytest.fixture(scope="module")
def fp32_run(hf_dir, tokenizer):
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    params = {"max_new_tokens": max(AGREE.values()), "temperature": 0, "ignore_eos": True}
    with Engine(str(hf_dir), max_total_tokens=512, page_size=16) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    return prompts, [o["output_ids"] for o in outs]


@pytest.mark.parametrize("scheme", sorted(AGREE))
def test_quantized_smollm2_agrees_with_fp32(scheme, hf_dir, fp32_run, tmp_path):
    prompts, want = fp32_run
    write_compressed_tensors(hf_dir, tmp_path, scheme, 32)
    params = {"max_new_tokens": AGREE[scheme], "temperature": 0, "ignore_eos": True}
    with Engine(str(tmp_path), max_total_tokens=512, page_size=16) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        info = engine.get_server_info()["resolved"]
    assert [o["output_ids"] for o in outs] == [w[: AGREE[scheme]] for w in want]
    if CpuKernels.load() is not None:  # fused qkv, o, gate_up, down of 30 layers
        assert info["weight_format"] == scheme.removesuffix("_asym")
        assert info["quantized_weights"] == 30 * 4
