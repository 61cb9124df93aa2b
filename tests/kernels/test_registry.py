"""Backend selection, the FlashInfer page table, and ForwardBatch helpers (no GPU needed)."""

from __future__ import annotations

import importlib

import pytest
import torch

import radixlm.kernels as kernels
from radixlm.kernels import ForwardMode, resolve_attention_backend
from radixlm.kernels.flashinfer import paged_kv_layout
from radixlm.kernels.forward_batch import tree_mask_indptr
from tests.kernels.cases import make_case


def test_auto_resolution(monkeypatch):
    assert resolve_attention_backend("auto", "cpu") == "cpu"
    assert resolve_attention_backend("torch_native", "cpu") == "torch_native"
    monkeypatch.setattr(kernels, "flashinfer_available", lambda: False)
    assert resolve_attention_backend("auto", "cuda") == "triton"
    monkeypatch.setattr(kernels, "flashinfer_available", lambda: True)
    assert resolve_attention_backend("auto", "cuda", "bfloat16") == "flashinfer"
    assert resolve_attention_backend("auto", "cuda", "float32") == "triton"
    assert resolve_attention_backend("flashinfer", "cuda:0") == "flashinfer"


def test_gpu_backends_refused_on_cpu(monkeypatch):
    with pytest.raises(ValueError, match="'cpu' runs on CPU"):
        resolve_attention_backend("cpu", "cuda")
    with pytest.raises(ValueError, match="flashinfer"):
        resolve_attention_backend("flashinfer", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="triton"):
        resolve_attention_backend("triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_attention_backend("triton", "cpu") == "triton"
    monkeypatch.setattr(kernels, "flashinfer_available", lambda: False)
    with pytest.raises(ValueError, match="radixlm\\[gpu\\]"):
        resolve_attention_backend("flashinfer", "cuda")


def test_flashinfer_module_imports_without_flashinfer():
    module = importlib.reload(importlib.import_module("radixlm.kernels.flashinfer"))
    assert module.FlashInferBackend.supports_cuda_graph


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_kv_layout_covers_every_slot(page_size):
    case = make_case(ForwardMode.DECODE, [0, 1, 17, 40], [1, 1, 1, 1], page_size=page_size)
    fb = case.fb
    indptr, indices, last = paged_kv_layout(
        fb.req_to_token, fb.req_pool_indices, fb.seq_lens, page_size
    )
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    for i, s in enumerate(fb.seq_lens.tolist()):
        pages = indices[indptr[i] : indptr[i + 1]].to(torch.int64)
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()
        slots = slots[: (len(pages) - 1) * page_size + int(last[i])]
        want = fb.req_to_token[fb.req_pool_indices[i], :s].to(torch.int64)
        assert torch.equal(slots, want)
        assert 1 <= int(last[i]) <= page_size


def test_forward_batch_to_and_mask_indptr():
    case = make_case(ForwardMode.TARGET_VERIFY, [0, 3], [2, 4])
    fb = case.fb
    assert tree_mask_indptr(fb.extend_seq_lens, fb.seq_lens).tolist() == [0, 4, 4 + 28]
    assert fb.custom_mask.numel() == 32
    moved = fb.to("cpu")
    assert moved.mode is ForwardMode.TARGET_VERIFY
    assert torch.equal(moved.custom_mask, fb.custom_mask)
    assert moved.batch_size == 2


def test_fp8_kv_pools_steer_backend_choice(monkeypatch):
    """An fp8 KV pool: 'auto' on CUDA takes triton even where flashinfer would serve a
    half-precision model; flashinfer by name is refused, naming both."""
    monkeypatch.setattr(kernels, "flashinfer_available", lambda: True)
    fp8 = torch.float8_e4m3fn
    assert resolve_attention_backend("auto", "cuda", "bfloat16") == "flashinfer"
    assert resolve_attention_backend("auto", "cuda", "bfloat16", fp8) == "triton"
    assert resolve_attention_backend("auto", "cpu", "float32", fp8) == "cpu"
    with pytest.raises(ValueError, match="'flashinfer' does not read an fp8 KV cache"):
        resolve_attention_backend("flashinfer", "cuda", "bfloat16", torch.float8_e5m2)
