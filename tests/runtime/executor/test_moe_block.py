"""The sparse MoE block (`layers.moe`) equals transformers' MoE blocks of Mixtral,
Qwen2-MoE and Qwen3-MoE with every CPU experts implementation, counts the distinct
experts of each forward, and loads the per-expert names `save_pretrained` writes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.executor.layers import TorchLayers
from radixlm.runtime.executor.layers.moe import (
    ExpertCounter,
    MoEOptions,
    SparseMoeBlock,
    route,
)
from radixlm.runtime.executor.layers.moe_experts import TorchExperts
from radixlm.runtime.executor.layers.packed import PackedExperts

HIDDEN, EXPERTS = 64, 8


def _config(family: str, norm_topk_prob: bool = True):
    if family == "mixtral":
        from transformers import MixtralConfig

        return MixtralConfig(
            hidden_size=HIDDEN, intermediate_size=48, num_local_experts=EXPERTS,
            num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128,
        )  # fmt: skip
    if family == "qwen2_moe":
        from transformers import Qwen2MoeConfig

        return Qwen2MoeConfig(
            hidden_size=HIDDEN, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            intermediate_size=96, num_experts=EXPERTS, num_experts_per_tok=2,
            norm_topk_prob=norm_topk_prob, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128,
        )  # fmt: skip
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        hidden_size=HIDDEN, moe_intermediate_size=32, intermediate_size=96,
        num_experts=EXPERTS, num_experts_per_tok=3, norm_topk_prob=norm_topk_prob,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip


def _hf_block(config):
    """transformers' MoE block of `config` with seeded N(0, 0.2) weights, fp32, eval."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cls = {
        "mixtral": MixtralSparseMoeBlock,
        "qwen2_moe": Qwen2MoeSparseMoeBlock,
        "qwen3_moe": Qwen3MoeSparseMoeBlock,
    }[config.model_type]
    torch.manual_seed(0)
    block = cls(config).float().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2)
    return block


def checkpoint_state(hf_block) -> dict[str, torch.Tensor]:
    """The block's weights under the names `save_pretrained` writes: transformers holds
    the experts fused as gate_up_proj [E, 2I, H] (gate rows, then up rows; its
    conversion_mapping concatenates gate_proj and up_proj on dim 1) and down_proj
    [E, H, I]; the files hold experts.{e}.{gate,up,down}_proj.weight."""
    state = {}
    for name, tensor in hf_block.state_dict().items():
        if name == "experts.gate_up_proj":
            inter = tensor.shape[1] // 2
            for e, w in enumerate(tensor):
                state[f"experts.{e}.gate_proj.weight"] = w[:inter].clone()
                state[f"experts.{e}.up_proj.weight"] = w[inter:].clone()
        elif name == "experts.down_proj":
            for e, w in enumerate(tensor):
                state[f"experts.{e}.down_proj.weight"] = w.clone()
        else:
            state[name] = tensor.clone()
    return state


def loaded_block(opts: MoEOptions, impl, state: dict, prefix: str = "") -> SparseMoeBlock:
    """A block loaded from `state` (strict) and past every module's post-load step."""
    block = SparseMoeBlock(opts, impl, prefix)
    block.load_state_dict(state, strict=True)
    TorchLayers().process_weights_after_loading(block)
    return block


def _impl(name: str, request):
    if name == "torch":
        return TorchExperts()
    return PackedExperts(request.getfixturevalue("cpu_kernels"))


CASES = [("mixtral", True), ("qwen2_moe", False), ("qwen2_moe", True), ("qwen3_moe", True),
         ("qwen3_moe", False)]  # fmt: skip


@pytest.mark.parametrize("impl_name", ["torch", "packed"])
@pytest.mark.parametrize(("family", "norm"), CASES)
def test_block_equals_transformers(family, norm, impl_name, request):
    config = _config(family, norm)
    hf = _hf_block(config)
    opts = MoEOptions.from_config(config)
    block = loaded_block(opts, _impl(impl_name, request), checkpoint_state(hf))
    for tokens in (1, 3, 17):
        x = torch.randn(tokens, HIDDEN)
        with torch.no_grad():
            want = hf(x[None])[0]
            got = block(x)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_counter_counts_distinct_experts_per_forward():
    config = _config("qwen3_moe")
    hf = _hf_block(config)
    block = loaded_block(MoEOptions.from_config(config), TorchExperts(), checkpoint_state(hf))
    hand = []
    for tokens in (1, 3, 17, 2):
        x = torch.randn(tokens, HIDDEN)
        with torch.no_grad():
            _, _, ids = hf.gate(x)
            block(x)
        hand.append(len(set(ids.flatten().tolist())))
        assert block.counter.last == hand[-1]
    assert hand[0] == 3 and hand[2] > 3  # one token: its top-3; 17 tokens touch more
    assert (block.counter.steps, block.counter.total) == (4, sum(hand))
    assert block.counter.mean == pytest.approx(sum(hand) / 4)


def test_counter_accepts_tensors_and_resets():
    counter = ExpertCounter()
    assert (counter.steps, counter.total, counter.last, counter.mean) == (0, 0, 0, 0.0)
    counter.record(torch.tensor(5))
    counter.record(3)
    assert (counter.steps, counter.total, counter.last, counter.mean) == (2, 8, 3, 4.0)
    counter.reset()
    assert (counter.steps, counter.total) == (0, 0)


def _loop_reference(x, opts: MoEOptions, state) -> torch.Tensor:
    """Token by token: sigmoid scores, top-k, renormalised, each expert's SwiGLU."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        scores = torch.sigmoid(x[t] @ state["gate.weight"].T)
        top, ids = torch.topk(scores, opts.top_k)
        top = top / top.sum()
        for w, e in zip(top, ids.tolist(), strict=True):
            g = x[t] @ state[f"experts.{e}.gate_proj.weight"].T
            u = x[t] @ state[f"experts.{e}.up_proj.weight"].T
            out[t] += w * (F.silu(g) * u) @ state[f"experts.{e}.down_proj.weight"].T
    return out


@pytest.mark.parametrize("impl_name", ["torch", "packed"])
def test_sigmoid_router_matches_a_token_loop(impl_name, request):
    opts = MoEOptions(num_experts=6, top_k=2, hidden=32, intermediate=16, router="sigmoid")
    torch.manual_seed(1)
    source = SparseMoeBlock(opts)
    state = {k: torch.randn(v.shape) * 0.3 for k, v in source.state_dict().items()}
    block = loaded_block(opts, _impl(impl_name, request), state)
    x = torch.randn(9, 32)
    with torch.no_grad():
        torch.testing.assert_close(block(x), _loop_reference(x, opts, state), atol=1e-5, rtol=1e-5)


def test_route_orders_and_normalises():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    opts = MoEOptions(num_experts=4, top_k=2, hidden=1, intermediate=1, norm_topk_prob=False)
    weights, ids = route(logits, opts)
    probs = F.softmax(logits, dim=-1)[0]
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(weights[0], probs[[1, 2]])
    weights, _ = route(logits, MoEOptions(4, 2, 1, 1, norm_topk_prob=True))
    torch.testing.assert_close(weights[0], probs[[1, 2]] / probs[[1, 2]].sum())


def test_block_loads_the_files_save_pretrained_writes(tmp_path):
    """A tiny Qwen2-MoE saved with save_pretrained: layer 0's `mlp.*` tensors load into the
    block (strict, prefix-relative names) and give the model's own MoE output."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config = _config("qwen2_moe")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(tmp_path)
    prefix = "model.layers.0.mlp"
    files = {}
    for f in tmp_path.glob("*.safetensors"):
        files.update(load_file(f))
    state = {k[len(prefix) + 1 :]: v for k, v in files.items() if k.startswith(prefix + ".")}
    block = loaded_block(MoEOptions.from_config(config), TorchExperts(), state, prefix)
    x = torch.randn(5, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(
            block(x), model.model.layers[0].mlp(x[None])[0], atol=2e-6, rtol=1e-5
        )


def test_options_from_config_and_bad_values():
    mixtral = MoEOptions.from_config(_config("mixtral"))
    assert (mixtral.num_experts, mixtral.top_k, mixtral.intermediate) == (8, 2, 48)
    assert mixtral.norm_topk_prob and mixtral.shared_intermediate is None
    qwen2 = MoEOptions.from_config(_config("qwen2_moe", norm_topk_prob=False))
    assert (qwen2.intermediate, qwen2.shared_intermediate) == (32, 48)
    assert qwen2.shared_expert_gate and not qwen2.norm_topk_prob
    qwen3 = MoEOptions.from_config(_config("qwen3_moe"))
    assert (qwen3.top_k, qwen3.shared_intermediate, qwen3.shared_expert_gate) == (3, None, False)
    with pytest.raises(ValueError, match="top_k"):
        MoEOptions(num_experts=4, top_k=5, hidden=8, intermediate=8)
    with pytest.raises(ValueError, match="router"):
        MoEOptions(num_experts=4, top_k=2, hidden=8, intermediate=8, router="relu")
    with pytest.raises(ValueError, match="model_type"):
        MoEOptions.from_config(type("C", (), {"model_type": "llama"})())
    with pytest.raises(RuntimeError, match="process_weights_after_loading"):
        SparseMoeBlock(MoEOptions(4, 2, 8, 8))(torch.zeros(1, 8))


def test_each_expert_read_once_per_step(monkeypatch):
    """Grouping: a forward calls each touched expert's GEMMs once, over all its rows."""
    opts = MoEOptions(num_experts=4, top_k=2, hidden=16, intermediate=8)
    torch.manual_seed(2)
    state = {k: torch.randn(v.shape) for k, v in SparseMoeBlock(opts).state_dict().items()}
    block = loaded_block(opts, TorchExperts(), state)
    calls = []
    run = block.grouped_experts._run
    monkeypatch.setattr(
        block.grouped_experts, "_run", lambda e, rows: calls.append((e, len(rows))) or run(e, rows)
    )
    x = torch.randn(32, 16)
    with torch.no_grad():
        _, ids = route(block.gate(x), opts)
        block(x)
    counts = torch.bincount(ids.flatten(), minlength=4)
    assert calls == [(e, int(n)) for e, n in enumerate(counts) if n]
