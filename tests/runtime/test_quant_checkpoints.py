"""Quantized checkpoints (compressed-tensors W4A16 / W8A8 int8 / W8A8 fp8, GPTQ, AWQ) written
from their specs (tests/quant_checkpoints.py) from a tiny random Llama: the readers give
exactly the encoded weights, radixlm's packed CPU layout keeps them quantized, and its
greedy output equals transformers running the dequantized weights (W8A8 int8: with each
linear replaced by `quant_ref.w8a8_int8_ref`) token for token; bad schemes fail at load."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from radixlm import Engine
from radixlm.kernels import quant_ref
from radixlm.kernels.cpu import CpuKernels
from radixlm.runtime.executor.model_registry import read_hf_config
from radixlm.runtime.executor.quant import UnsupportedQuantizationError, load_quantized
from tests.quant_checkpoints import write_awq, write_compressed_tensors, write_gptq
from tests.runtime.conftest import hf_greedy
from tests.tiny_models import save_random_model, tiny_config

pytest.importorskip("compressed_tensors")

PROMPTS = [[5, 17, 300, 4000, 9], [77] * 30 + [123, 456], list(range(100, 160))]
NEW = 10

CASES = {
    "ct-w4a16-g32": lambda s, d: write_compressed_tensors(s, d, "w4a16", 32),
    "ct-w4a16-asym-g64": lambda s, d: write_compressed_tensors(s, d, "w4a16_asym", 64),
    "ct-w4a16-channel": lambda s, d: write_compressed_tensors(s, d, "w4a16", -1),
    "ct-w8a8-int8": lambda s, d: write_compressed_tensors(s, d, "w8a8_int8"),
    "ct-w8a8-int8-static": lambda s, d: write_compressed_tensors(s, d, "w8a8_int8", static=True),
    "ct-w8a8-fp8": lambda s, d: write_compressed_tensors(s, d, "w8a8_fp8"),
    "gptq-g32": lambda s, d: write_gptq(s, d, 32),
    "gptq-channel": lambda s, d: write_gptq(s, d, -1),
    "awq-g32": lambda s, d: write_awq(s, d, 32),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, hf_dir):
    path = tmp_path_factory.mktemp("tiny-fp32")
    model = save_random_model(tiny_config("llama"), path, hf_dir)
    return path, model


class W8A8Int8Linear(nn.Module):
    """The reference W8A8 int8 linear: `quant_ref.w8a8_int8_ref` on the canonical tensors."""

    def __init__(self, q, w_scale, act_scale):
        super().__init__()
        self.q, self.w_scale, self.act_scale = q, w_scale, act_scale

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        y = quant_ref.w8a8_int8_ref(flat, self.q, self.w_scale, self.act_scale)
        return y.reshape(*x.shape[:-1], -1)


def _reference(model, want: dict, quantized: dict, int8: bool):
    """transformers `model` with the checkpoint's dequantized weights (int8: quant_ref's
    W8A8 linears built from the writer's values)."""
    import copy

    ref = copy.deepcopy(model)
    for name, w in want.items():
        parent, attr = name.rsplit(".", 1)
        owner = ref.get_submodule(parent)
        if int8:
            qw = quantized[name]
            setattr(owner, attr, W8A8Int8Linear(qw.q, qw.scales, qw.act_scale))
        else:
            getattr(owner, attr).weight.data = w.clone()
    return ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_checkpoint_loads_and_matches_the_dequantized_reference(case, tiny, tmp_path):
    src, model = tiny
    want = CASES[case](src, tmp_path)
    config = read_hf_config(tmp_path)
    quantized = load_quantized(tmp_path, config)
    assert sorted(quantized) == sorted(want)
    for name, w in want.items():  # the canonical layout holds exactly the encoded values
        assert torch.equal(quantized[name].dequantize(), w), name
    int8 = "int8" in case
    refs = hf_greedy(_reference(model, want, quantized, int8), PROMPTS, NEW, eos_token_id=None)
    params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(str(tmp_path), max_total_tokens=1024, page_size=4) as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=params)
        info = engine.get_server_info()["resolved"]
    assert [o["output_ids"] for o in outs] == refs
    if CpuKernels.load() is not None:  # fused qkv, o, gate_up, down kept quantized per layer
        assert info["quantized_weights"] == 4 * config.num_hidden_layers
        assert info["weight_format"] == next(iter(quantized.values())).scheme


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    qcfg = cfg["quantization_config"]
    for key, value in changes.items():
        if key == "weights":
            qcfg["config_groups"]["group_0"]["weights"].update(value)
        elif key == "group":
            qcfg["config_groups"]["group_0"].update(value)
        else:
            qcfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


BAD = {
    "unknown method": (lambda s, d: write_gptq(s, d), {"quant_method": "hqq"}, "'hqq'"),
    "gptq 8-bit": (lambda s, d: write_gptq(s, d), {"bits": 8}, "8-bit"),
    "gptq desc_act": (lambda s, d: write_gptq(s, d, desc_act=True), {}, "desc_act"),
    "group size 16": (lambda s, d: write_gptq(s, d, 32), {"group_size": 16}, "group size 16"),
    "awq gemv": (lambda s, d: write_awq(s, d), {"version": "gemv"}, "'gemv'"),
    "ct format": (
        lambda s, d: write_compressed_tensors(s, d, "w4a16"),
        {"group": {"format": "marlin-24"}},
        "marlin-24",
    ),
    "ct actorder": (
        lambda s, d: write_compressed_tensors(s, d, "w4a16"),
        {"weights": {"actorder": "group"}},
        "activation ordering",
    ),
    "ct int8 weight-only": (
        lambda s, d: write_compressed_tensors(s, d, "w8a8_int8"),
        {"weights": {"strategy": "group", "group_size": 32}},
        "strategy group",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_unsupported_quantization_fails_at_load_naming_it(case, tiny, tmp_path):
    write, changes, named = BAD[case]
    write(tiny[0], tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(UnsupportedQuantizationError, match=named):
        load_quantized(tmp_path, read_hf_config(tmp_path))
    with pytest.raises(UnsupportedQuantizationError, match=named):
        Engine(str(tmp_path), max_total_tokens=256, page_size=4, cpu_gemm="torch")


def test_ignored_modules_load_in_float(tiny, tmp_path):
    """Layer 0's MLP left out through an `ignore` regex: its float weights load as they are
    and stay fp32 panels; the other projections stay quantized."""
    src, model = tiny
    want = write_compressed_tensors(src, tmp_path, "w4a16", 32)
    state = load_file(tmp_path / "model.safetensors")
    fp32 = load_file(next(src.glob("*.safetensors")))
    for proj in ("gate_proj", "up_proj", "down_proj"):
        name = f"model.layers.0.mlp.{proj}"
        for suffix in ("weight_packed", "weight_scale", "weight_shape"):
            state.pop(f"{name}.{suffix}")
        state[f"{name}.weight"] = fp32[f"{name}.weight"]
        want[name] = fp32[f"{name}.weight"]
    from safetensors.torch import save_file

    save_file(state, tmp_path / "model.safetensors")
    _edit_config(tmp_path, ignore=["lm_head", "re:model\\.layers\\.0\\.mlp\\..*"])
    assert len(load_quantized(tmp_path, read_hf_config(tmp_path))) == len(want) - 3
    refs = hf_greedy(_reference(model, want, {}, False), PROMPTS, NEW, eos_token_id=None)
    params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(str(tmp_path), max_total_tokens=1024, page_size=4) as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=params)
        info = engine.get_server_info()["resolved"]
    assert [o["output_ids"] for o in outs] == refs
    if CpuKernels.load() is not None:
        assert info["quantized_weights"] == 4 * 2 - 2  # layer 0's gate_up and down are fp32


@pytest.mark.parametrize("case", ["ct-w4a16-g32", "gptq-g32"])
def test_torch_cpu_path_runs_the_dequantized_weights(case, tiny, tmp_path):
    src, model = tiny
    want = CASES[case](src, tmp_path)
    refs = hf_greedy(_reference(model, want, {}, False), PROMPTS, NEW, eos_token_id=None)
    params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    kw = {"cpu_gemm": "torch", "attention_backend": "torch_native"}
    with Engine(str(tmp_path), max_total_tokens=1024, page_size=4, **kw) as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=params)
    assert [o["output_ids"] for o in outs] == refs


@pytest.mark.parametrize(
    "case,dtype",
    [
        ("ct-w4a16-g32", "int4"),
        ("ct-w8a8-int8", "int8"),
        ("ct-w8a8-fp8", "fp8"),
        ("gptq-g32", "int4"),
        ("awq-g32", "int4"),
    ],  # fmt: skip
)
def test_plan_reads_the_checkpoints_weight_format(case, dtype, tiny, tmp_path):
    from radixlm.plan.commands_memory import weight_dtype_of
    from radixlm.plan.models import load_model

    CASES[case](tiny[0], tmp_path)
    assert load_model(str(tmp_path)).checkpoint_dtype == dtype
    args = argparse.Namespace(model=str(tmp_path), dtype=None, gpu="H100-SXM")
    assert weight_dtype_of(args) == dtype
    assert load_model(str(tiny[0])).checkpoint_dtype is None


@pytest.mark.parametrize("case", ["ct-w4a16-g32", "ct-w8a8-int8-static", "ct-w8a8-fp8"])
def test_cuda_layers_swap_in_quantized_linears(case, tiny, tmp_path, monkeypatch):
    """The CUDA path's `QuantizedLinear` hands the canonical tensors to the Triton kernels'
    entry points (stood in for here by quant_ref, the functions they must match)."""
    import sys
    import types

    from radixlm.runtime.executor.layers import CudaLayers
    from radixlm.runtime.executor.layers.quant_linear import QuantizedLinear
    from radixlm.runtime.executor.weights import load_model

    fake = types.ModuleType("radixlm.kernels.triton.quant_gemm")
    fake.w4a16_gemm = quant_ref.w4a16_ref
    fake.w8a8_int8_gemm = quant_ref.w8a8_int8_ref
    fake.w8a8_fp8_gemm = quant_ref.w8a8_fp8_ref
    monkeypatch.setitem(sys.modules, "radixlm.kernels.triton.quant_gemm", fake)
    CASES[case](tiny[0], tmp_path)
    config = read_hf_config(tmp_path)
    quantized = load_quantized(tmp_path, config)
    model = load_model(tmp_path, config, torch.float32, "cpu", CudaLayers(quantized))
    name = "model.layers.1.mlp.down_proj"
    module = model.get_submodule(name)
    assert isinstance(module, QuantizedLinear)
    assert sum(isinstance(m, QuantizedLinear) for m in model.modules()) == len(quantized)
    x = torch.randn(2, 3, module.in_features)
    qw = quantized[name]
    flat = x.reshape(6, -1)
    if qw.scheme == "w4a16":
        ref = quant_ref.w4a16_ref(flat, qw.q, qw.scales, qw.zeros, 32)
    elif qw.scheme == "w8a8_int8":
        ref = quant_ref.w8a8_int8_ref(flat, qw.q, qw.scales, qw.act_scale)
    else:
        ref = quant_ref.w8a8_fp8_ref(flat, qw.q, qw.scales, qw.act_scale)
    # The same function on the same values; the float matmul's summation order may differ
    # with the input's memory layout, hence a few ulps of tolerance.
    torch.testing.assert_close(module(x), ref.reshape(2, 3, -1), rtol=1e-6, atol=1e-5)
