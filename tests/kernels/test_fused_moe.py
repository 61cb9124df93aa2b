"""The Triton fused-MoE kernel against the torch reference (`StackedExperts`), and a
`SparseMoeBlock` with `TritonExperts` against transformers' Qwen2-MoE block."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.executor.layers import TorchLayers
from radixlm.runtime.executor.layers.moe import MoEOptions, SparseMoeBlock
from radixlm.runtime.executor.layers.moe_experts import (
    StackedExperts,
    TorchExperts,
    TritonExperts,
)


def _random_block(opts: MoEOptions, impl, seed: int = 0) -> SparseMoeBlock:
    torch.manual_seed(seed)
    block = SparseMoeBlock(opts, impl)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    return block


def test_moe_align_pads_each_expert_to_whole_tiles():
    from radixlm.kernels.triton.fused_moe import moe_align

    ids = torch.tensor([[1, 0], [1, 3], [1, 0]])  # pairs 0..5: experts 1,0,1,3,1,0
    sorted_ids, expert_ids, num_padded = moe_align(ids, 4, 4)
    pad = 6
    # 6 pairs + min(4, 6) * 3 = 18 -> 20 slots
    assert sorted_ids.tolist() == [1, 5, pad, pad, 0, 2, 4, pad, 3, pad, pad, pad] + [pad] * 8
    assert expert_ids.tolist() == [0, 1, 3, 4, 4]
    assert num_padded.tolist() == [12]


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "hidden", "inter"),
    [(1, 8, 2, 64, 96), (3, 8, 2, 64, 96), (17, 6, 3, 48, 40), (40, 4, 1, 32, 16)],
)
def test_fused_moe_matches_grouped_torch(tokens, experts, top_k, hidden, inter, device):
    from radixlm.kernels.triton.fused_moe import fused_moe

    opts = MoEOptions(num_experts=experts, top_k=top_k, hidden=hidden, intermediate=inter)
    block = _random_block(opts, TorchExperts())
    reference = StackedExperts(list(block.experts)).to(device)
    x = torch.randn(tokens, hidden, device=device)
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]).to(device)
    weights = torch.rand(tokens, top_k, device=device)
    got = fused_moe(x, reference.w13, reference.w2, ids, weights)
    torch.testing.assert_close(got, reference(x, ids, weights), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_triton_experts_block_equals_transformers_qwen2_moe(tokens, device):
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    config = Qwen2MoeConfig(
        hidden_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = Qwen2MoeSparseMoeBlock(config).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2)
    state = {}
    for name, t in hf.state_dict().items():
        if name == "experts.gate_up_proj":  # [E, 2I, H]: gate rows, then up rows
            for e, w in enumerate(t):
                state[f"experts.{e}.gate_proj.weight"] = w[:32]
                state[f"experts.{e}.up_proj.weight"] = w[32:]
        elif name == "experts.down_proj":
            for e, w in enumerate(t):
                state[f"experts.{e}.down_proj.weight"] = w
        else:
            state[name] = t
    block = SparseMoeBlock(MoEOptions.from_config(config), TritonExperts())
    block.load_state_dict(state, strict=True)
    TorchLayers().process_weights_after_loading(block)
    block.to(device)
    x = torch.randn(tokens, 64)
    with torch.no_grad():
        want = hf(x[None])[0]
        got = block(x.to(device)).cpu()
        _, _, ids = hf.gate(x)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert block.counter.last == len(set(ids.flatten().tolist()))  # counted on the device
