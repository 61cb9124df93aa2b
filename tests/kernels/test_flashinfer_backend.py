"""The FlashInfer backend's plumbing (page table, plan/run per mode, custom mask, CUDA-graph
decode wrappers) on CPU against torch_native, with a torch stand-in for `flashinfer`."""

from __future__ import annotations

import sys

import pytest
import torch

from radixlm.kernels import create_attention_backend
from tests.kernels import fake_flashinfer
from tests.kernels.cases import make_case
from tests.kernels.test_attention import MODES


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())


def _backend(name, case, page_size):
    info = dict(num_heads=case.q.shape[1], page_size=page_size, dtype=case.q.dtype)
    return create_attention_backend(name, case.clone_pool(), case.scaling, **info)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3])
def test_flashinfer_backend_matches_torch_native(mode, page_size, group, fake):
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_case(fmode, prefix_lens, extend_lens, page_size=page_size, group=group)
    outs = []
    for name in ("torch_native", "flashinfer"):
        backend = _backend(name, case, page_size)
        backend.init_forward_metadata(case.fb)
        outs.append(backend.forward(case.q, case.k, case.v, 0, case.fb))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def test_flashinfer_graph_decode_wrappers(fake):
    fmode, prefix_lens, extend_lens = MODES["decode"]
    case = make_case(fmode, prefix_lens, extend_lens, page_size=16, group=3)
    ref = _backend("torch_native", case, 16)
    ref.init_forward_metadata(case.fb)
    want = ref.forward(case.q, case.k, case.v, 0, case.fb)
    backend = _backend("flashinfer", case, 16)
    backend.init_cuda_graph_state(8, case.fb.req_to_token.shape[1])
    for _ in range(2):  # the second plan reuses the wrapper made for this batch size
        backend.init_forward_metadata_cuda_graph(case.fb)
        got = backend.forward(case.q, case.k, case.v, 0, case.fb)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert list(backend._graph_decode) == [case.fb.batch_size]
    assert list(backend._graph_decode[case.fb.batch_size]) == [None]
