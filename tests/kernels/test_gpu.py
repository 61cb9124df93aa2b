"""GPU-only checks: compiled Triton kernels in half precision, the FlashInfer backend, and
decode CUDA graphs end to end. Skipped without CUDA; the Triton ones also need
TRITON_INTERPRET=0 (run by `benchmarks/gpu_kernels.py`)."""

from __future__ import annotations

import os

import pytest
import torch

from radixlm.kernels import ForwardMode, create_attention_backend
from tests.kernels.cases import make_case, save_tiny_llama
from tests.kernels.test_model_triton import generate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
MODES = {
    "extend": (ForwardMode.EXTEND, [0, 1, 17, 300], [7, 19, 1, 130]),
    "decode": (ForwardMode.DECODE, [0, 1, 17, 40, 1000], [1] * 5),
    "verify": (ForwardMode.TARGET_VERIFY, [0, 1, 17], [4, 6, 5]),
}


@pytest.fixture
def compiled():
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        pytest.skip("set TRITON_INTERPRET=0 to compile Triton kernels")


def _attend(name: str, case, **model_info):
    pool = case.clone_pool()
    backend = create_attention_backend(name, pool, case.scaling, **model_info)
    backend.init_forward_metadata(case.fb)
    return backend.forward(case.q, case.k, case.v, 0, case.fb)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_half_precision_matches_torch_native(backend, mode, page_size, group, compiled):
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_case(
        fmode, prefix_lens, extend_lens, page_size=page_size, group=group, head_dim=64,
        dtype=torch.float16, device="cuda",
    )  # fmt: skip
    want = _attend("torch_native", case)
    got = _attend(backend, case, num_heads=case.q.shape[1], page_size=page_size,
                  dtype=torch.float16)  # fmt: skip
    torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_half_precision_sliding_windows_match_torch_native(backend, mode, page_size, compiled):
    """A windowed (64 keys) and a full layer in one pool, in the compiled kernels."""
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_case(
        fmode, prefix_lens, extend_lens, page_size=page_size, group=3, head_dim=64,
        dtype=torch.float16, device="cuda", num_layers=2,
    )  # fmt: skip
    info = dict(num_heads=case.q.shape[1], page_size=page_size, dtype=torch.float16)
    outs = []
    for name in ("torch_native", backend):
        attn = create_attention_backend(
            name, case.clone_pool(), case.scaling, sliding_windows=[64, None], **info
        )
        attn.init_forward_metadata(case.fb)
        outs.append([attn.forward(case.q, case.k, case.v, i, case.fb) for i in range(2)])
    for want, got in zip(*outs):
        torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)


@pytest.fixture(scope="module")
def tiny_llama64(tmp_path_factory, hf_dir):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama64"), hf_dir, head_dim=64)


def test_triton_cuda_graphs_reproduce_torch_native(tiny_llama64, compiled):
    want = generate(tiny_llama64, "torch_native", device="cuda")
    assert generate(tiny_llama64, "triton", device="cuda", disable_cuda_graph=True) == want
    assert generate(tiny_llama64, "triton", device="cuda") == want


def test_flashinfer_cuda_graphs_reproduce_torch_native(tiny_llama64, compiled):
    pytest.importorskip("flashinfer")
    want = generate(tiny_llama64, "torch_native", device="cuda", dtype="bfloat16")
    got = generate(tiny_llama64, "flashinfer", device="cuda", dtype="bfloat16")
    assert got == want
    eager = generate(
        tiny_llama64, "flashinfer", device="cuda", dtype="bfloat16", disable_cuda_graph=True
    )
    assert eager == want
