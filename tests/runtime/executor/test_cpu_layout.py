"""The CPU layer factories (packed panels, input-major) give the torch layers' results for
every row count, and report the bytes their layouts add."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import radixlm.kernels.cpu as cpu
from radixlm.runtime.executor.layers import (
    InputMajorCpuLayers,
    PackedCpuLayers,
    TorchLayers,
    cpu_layers,
    cpu_linear,
)
from radixlm.runtime.executor.layers.blocks import AttentionOptions
from radixlm.runtime.executor.layers.cpu_linear import PackedHead, PackedLinear
from radixlm.runtime.executor.layers.input_major import FEW_ROWS, FewRowsHead, InputMajorLinear


def _loaded(layers, module: nn.Module, state: dict) -> nn.Module:
    """`module` (built by `layers`) with `state` loaded under its checkpoint names and its
    final storage taken."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    layers.process_weights_after_loading(module)
    return module


@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS, FEW_ROWS + 1, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_input_major_layouts_match_linear(rows, bias):
    torch.manual_seed(0)
    head = nn.Linear(64, 1000, bias=bias)
    x = torch.randn(rows, 64)
    layers = InputMajorCpuLayers()
    few_rows = _loaded(layers, layers.lm_head(64, 1000, bias), head.state_dict())
    linear = _loaded(layers, layers.linear("proj", 64, 1000, bias), head.state_dict())
    assert isinstance(few_rows, FewRowsHead) and isinstance(linear, InputMajorLinear)
    torch.testing.assert_close(few_rows(x), head(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear(x), head(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_layouts_match_linear(cpu_kernels, monkeypatch, rows, bias):
    torch.manual_seed(1)
    head = nn.Linear(64, 1000, bias=bias)
    x = torch.randn(rows, 64)
    monkeypatch.setattr(cpu_linear, "PACKED_HEAD_ROWS", 20)  # 40 rows take F.linear
    layers = PackedCpuLayers(cpu_kernels, lm_head_screen=False)
    packed_head = _loaded(layers, layers.lm_head(64, 1000, bias), head.state_dict())
    proj = _loaded(layers, layers.linear("proj", 64, 1000, bias), head.state_dict())
    assert isinstance(packed_head, PackedHead) and isinstance(proj.proj, PackedLinear)
    torch.testing.assert_close(packed_head(x), head(x), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(proj(x), head(x), rtol=1e-5, atol=1e-4)


def _tiny_tied_model(layers) -> nn.Module:
    """An embedding, one projection and a tied head built by `layers`, loaded with random
    weights (before their post-load step)."""
    torch.manual_seed(2)
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed = nn.Embedding(1000, 64)
    # 40 outputs: the last panel holds 8 padding columns
    model.model.proj = layers.linear("model.proj", 64, 40, True)
    model.lm_head = layers.lm_head(64, 1000)
    for p in model.model.proj.parameters():
        p.data.normal_(0, 0.2)
    model.lm_head.weight = model.model.embed.weight
    return model


def test_input_major_conversion_keeps_tied_head_and_counts_the_copy():
    layers = InputMajorCpuLayers()
    model = _tiny_tied_model(layers)
    params_before = sum(p.numel() for p in model.parameters())
    layers.process_weights_after_loading(model)
    extra = layers.copy_bytes(model)
    assert extra == 1000 * 64 * 4
    assert isinstance(model.model.proj, InputMajorLinear)
    assert model.model.proj.weight_t.shape == (64, 40)
    assert model.lm_head.weight is model.model.embed.weight
    assert "lm_head.weight_t" not in model.state_dict()  # a runtime copy, never saved
    assert sum(p.numel() for p in model.parameters()) == params_before


def test_packed_conversion_keeps_tied_head_and_counts_panels_and_padding(cpu_kernels):
    layers = PackedCpuLayers(cpu_kernels)
    model = _tiny_tied_model(layers)
    x = torch.randn(3, 64)
    proj = model.model.proj
    want = torch.nn.functional.linear(x, proj.weight, proj.bias)
    layers.process_weights_after_loading(model)
    extra = layers.copy_bytes(model)
    # The head's panels (1000 columns pad to 63 panels = 1008) plus the projection's
    # padding, and the head's greedy screen: its 16-bit copy and two bound factors per row.
    assert extra == 1008 * 64 * 4 + 8 * 64 * 4 + 1008 * 64 * 2 + 2 * 1000 * 4
    assert isinstance(proj.proj, PackedLinear) and isinstance(model.lm_head, PackedHead)
    assert model.lm_head.weight is model.model.embed.weight
    assert "lm_head.panels" not in model.state_dict()
    torch.testing.assert_close(proj(x), want, rtol=1e-5, atol=1e-4)
    # Every panel tensor now lives in the one huge-page mapping, from its 2 MiB boundary.
    arena = model.panel_arena
    base = torch.frombuffer(arena, dtype=torch.float32).data_ptr()
    ptrs = [proj.proj.panels.data_ptr(), model.lm_head.panels.data_ptr()]
    ptrs.append(model.lm_head.screen.panels.data_ptr())
    assert all(base <= p < base + len(arena) for p in ptrs)
    assert min(ptrs) % cpu.HUGE_PAGE == 0 and all(p % 64 == 0 for p in ptrs)


_CFG = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
    rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=128,
)  # fmt: skip


def _tiny_layer(layer_id: int = 0, seed: int = 3):
    """A torch decoder layer with random weights (q/k/v biases), and its RoPE."""
    from types import SimpleNamespace

    from radixlm.runtime.executor.layers.blocks import RotaryEmbedding

    cfg = SimpleNamespace(**_CFG)
    torch.manual_seed(seed)
    opts = AttentionOptions(qkv_bias=True)
    layer = TorchLayers().decoder_layer(cfg, layer_id, opts, f"model.layers.{layer_id}")
    for p in layer.parameters():
        p.data.normal_(0, 0.2)
    return layer, RotaryEmbedding(cfg)


def _packed_layer(layer, cpu_kernels) -> nn.Module:
    """The packed layer (`PackedCpuLayers.decoder_layer`) loaded with `layer`'s weights."""
    from types import SimpleNamespace

    layers = PackedCpuLayers(cpu_kernels)
    opts = AttentionOptions(qkv_bias=True)
    packed = layers.decoder_layer(
        SimpleNamespace(**_CFG), layer.self_attn.layer_id, opts, "model.layers.0"
    )
    return _loaded(layers, packed, layer.state_dict())


def test_packed_decoder_layer_equals_the_original(cpu_kernels):
    """PackedAttention (fused q/k/v, C RoPE), PackedMLP and CpuRMSNorm give the llama
    modules' outputs; attention goes through the same backend call."""
    from types import SimpleNamespace

    from radixlm.kernels import ForwardMode

    layer, rotary = _tiny_layer()
    rope = rotary(torch.arange(5, 10), torch.float32)
    seen = []

    class EchoBackend:  # attention = q itself; records what the layer passed
        def forward(self, q, k, v, layer_id, fb):
            seen.append((q.clone(), k.clone(), v.clone()))
            return q.reshape(q.shape[0], -1).clone()

    x = torch.randn(5, 64)
    fb = SimpleNamespace(mode=ForwardMode.EXTEND)
    with torch.inference_mode():
        want = layer(x, rope, EchoBackend(), fb)
        packed = _packed_layer(layer, cpu_kernels)
        got = packed(x, rope, EchoBackend(), fb)
    assert type(packed).__name__ == "CpuDecoderLayer"
    assert type(packed.self_attn).__name__ == "PackedAttention"
    for a, b in zip(seen[0], seen[1]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# step -> (mode, new tokens per request, whether the fused C stack runs it)
STEPS = {
    "decode": ("DECODE", [1, 1, 1], True),
    "extend": ("EXTEND", [2, 5, 1], True),
    "long extend": ("EXTEND", [30, 40, 1], True),  # 71 tokens: one C call as well
    "chain verify": ("TARGET_VERIFY", [3, 5, 1], True),
    "root-only verify": ("TARGET_VERIFY", [1, 1, 1], True),  # no drafts: decode attention
    "tree verify": ("TARGET_VERIFY", [3, 5, 1], False),
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_fused_decode_stack_equals_the_llama_layers(cpu_kernels, step, monkeypatch):
    """On the cpu backend FusedDecodeStack runs a decode step's layers, and those of an
    extend or chain-draft verify, as one C call (a tree verify layer by layer): same
    output and the same K/V written in every layer as the llama layers in order on
    torch_native."""
    from radixlm.kernels import ForwardMode, create_attention_backend
    from radixlm.runtime.executor.layers.blocks import run_in_order
    from radixlm.runtime.executor.layers.fused_stack import FusedDecodeStack
    from tests.kernels.cases import make_case

    mode, extend, fused = STEPS[step]
    mode = ForwardMode[mode]
    layers = nn.ModuleList(_tiny_layer(i, seed=3 + i)[0] for i in range(2))
    rotary = _tiny_layer()[1]
    case = make_case(mode, [0, 3, 40], extend, page_size=1, group=2, num_layers=2)
    if step in ("chain verify", "root-only verify"):  # drafts see the prefix and earlier drafts
        case.fb.custom_mask = torch.cat(
            [
                torch.cat(
                    [torch.ones(n, p, dtype=torch.bool), torch.ones(n, n).tril() > 0], 1
                ).flatten()
                for p, n in zip([0, 3, 40], extend)
            ]
        )
    rope = rotary(case.fb.positions, torch.float32)
    x = torch.randn(sum(extend), 64)
    packed = nn.ModuleList(_packed_layer(layer, cpu_kernels) for layer in layers)
    calls = []
    decode_layers = cpu_kernels.decode_layers
    monkeypatch.setattr(
        cpu_kernels, "decode_layers", lambda *a: calls.append(a[-1]) or decode_layers(*a)
    )
    results = []
    with torch.inference_mode():
        for name, run in (
            ("torch_native", run_in_order),
            ("cpu", FusedDecodeStack(packed, cpu_kernels)),
        ):
            pool = case.clone_pool()
            backend = create_attention_backend(name, pool, 16**-0.5)
            backend.init_forward_metadata(case.fb)
            mods = layers if name == "torch_native" else packed
            results.append((run(mods, x.clone(), rope, backend, case.fb), pool))
    (want, ref_pool), (got, pool) = results
    assert bool(calls) == fused
    if step in ("decode", "root-only verify"):  # ext_lens None: the decode attention kernel
        assert all(ext_lens is None for ext_lens in calls)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    loc = case.fb.out_cache_loc
    for i in range(2):
        torch.testing.assert_close(pool.k_buffer[i][loc], ref_pool.k_buffer[i][loc])
        torch.testing.assert_close(pool.v_buffer[i][loc], ref_pool.v_buffer[i][loc])


def test_fused_decode_stack_rejects_layers_it_cannot_run(cpu_kernels):
    from radixlm.runtime.executor.layers.fused_stack import FusedDecodeStack

    with pytest.raises(ValueError, match="fused-capable"):
        FusedDecodeStack(nn.ModuleList([_tiny_layer()[0]]), cpu_kernels)  # not packed
    with pytest.raises(ValueError, match="fused-capable"):
        FusedDecodeStack(nn.ModuleList(), cpu_kernels)
    odd = _packed_layer(_tiny_layer()[0], cpu_kernels)
    odd.fused_decode = False  # e.g. a head_dim that is not a multiple of 8
    with pytest.raises(ValueError, match="fused-capable"):
        FusedDecodeStack(nn.ModuleList([odd]), cpu_kernels)


def test_other_dtypes_keep_the_input_major_layout(cpu_kernels):
    layers = cpu_layers(cpu_kernels, torch.bfloat16)
    assert isinstance(layers, InputMajorCpuLayers)
    model = _tiny_tied_model(layers).to(torch.bfloat16)
    layers.process_weights_after_loading(model)
    assert isinstance(model.model.proj, InputMajorLinear)
    assert isinstance(model.lm_head, FewRowsHead)
    assert isinstance(cpu_layers(cpu_kernels, torch.float32), PackedCpuLayers)
    assert isinstance(cpu_layers(None, torch.float32), InputMajorCpuLayers)
