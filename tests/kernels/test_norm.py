"""Triton RMSNorm and fused SwiGLU against the model's torch modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.executor.layers.blocks import RMSNorm


@pytest.mark.parametrize("hidden", [64, 96])
def test_rms_norm_matches_model_module(hidden, device):
    from radixlm.kernels.triton import rms_norm

    torch.manual_seed(0)
    module = RMSNorm(hidden, 1e-5).to(device)
    with torch.no_grad():
        module.weight.normal_()
    x = torch.randn(5, hidden, device=device) * 3
    torch.testing.assert_close(rms_norm(x, module.weight, 1e-5), module(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width", [128, 1536 + 8])
def test_silu_and_mul_matches_swiglu(width, device):
    from radixlm.kernels.triton import silu_and_mul

    torch.manual_seed(0)
    gate, up = torch.randn(2, 3, width, device=device), torch.randn(2, 3, width, device=device)
    want = F.silu(gate) * up
    torch.testing.assert_close(silu_and_mul(gate, up), want, atol=1e-5, rtol=1e-5)


def test_store_kv_casts_into_pool(device):
    from radixlm.kernels.triton import store_kv

    torch.manual_seed(0)
    k_buf = torch.zeros(10, 3, 8, dtype=torch.float16, device=device)
    v_buf = torch.zeros(10, 3, 8, dtype=torch.float16, device=device)
    loc = torch.tensor([7, 2, 9], device=device)
    k, v = torch.randn(3, 3, 8, device=device), torch.randn(3, 3, 8, device=device)
    store_kv(k_buf, v_buf, loc, k, v)
    torch.testing.assert_close(k_buf[loc], k.half(), atol=0, rtol=0)
    torch.testing.assert_close(v_buf[loc], v.half(), atol=0, rtol=0)
    assert k_buf[[0, 1, 3, 4, 5, 6, 8]].abs().sum() == 0
