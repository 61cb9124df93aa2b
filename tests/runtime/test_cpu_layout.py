"""The CPU weight layouts give the nn.Linear results for every row count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import radixlm.kernels.cpu as cpu
from radixlm.runtime.executor.models import cpu_linear
from radixlm.runtime.executor.models.cpu_layout import (
    FEW_ROWS,
    FewRowsHead,
    InputMajorLinear,
    PackedHead,
    PackedLinear,
    use_cpu_layout,
)


@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS, FEW_ROWS + 1, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_input_major_layouts_match_linear(rows, bias):
    torch.manual_seed(0)
    head = nn.Linear(64, 1000, bias=bias)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(FewRowsHead(head)(x), head(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(InputMajorLinear(head)(x), head(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_layouts_match_linear(cpu_kernels, monkeypatch, rows, bias):
    torch.manual_seed(1)
    head = nn.Linear(64, 1000, bias=bias)
    x = torch.randn(rows, 64)
    monkeypatch.setattr(cpu_linear, "PACKED_HEAD_ROWS", 20)  # 40 rows take F.linear
    torch.testing.assert_close(PackedHead(head, cpu_kernels)(x), head(x), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(PackedLinear(head, cpu_kernels)(x), head(x), rtol=1e-5, atol=1e-4)


def _tiny_tied_model() -> nn.Module:
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed = nn.Embedding(1000, 64)
    model.model.proj = nn.Linear(64, 40)  # 40 outputs: the last panel holds 8 padding columns
    model.lm_head = nn.Linear(64, 1000, bias=False)
    model.lm_head.weight = model.model.embed.weight
    return model


def test_input_major_conversion_keeps_tied_head_and_counts_the_copy():
    model = _tiny_tied_model()
    params_before = sum(p.numel() for p in model.parameters())
    extra = use_cpu_layout(model, None)
    assert extra == 1000 * 64 * 4
    assert isinstance(model.model.proj, InputMajorLinear)
    assert model.model.proj.weight_t.shape == (64, 40)
    assert model.lm_head.weight is model.model.embed.weight
    assert "lm_head.weight_t" not in model.state_dict()  # a runtime copy, never saved
    assert sum(p.numel() for p in model.parameters()) == params_before


def test_packed_conversion_keeps_tied_head_and_counts_panels_and_padding(cpu_kernels):
    model = _tiny_tied_model()
    x = torch.randn(3, 64)
    want = model.model.proj(x)
    extra = use_cpu_layout(model, cpu_kernels)
    # The head's panels (1000 columns pad to 63 panels = 1008) plus the projection's
    # padding, and the head's greedy screen: its 16-bit copy and two bound factors per row.
    assert extra == 1008 * 64 * 4 + 8 * 64 * 4 + 1008 * 64 * 2 + 2 * 1000 * 4
    assert isinstance(model.model.proj, PackedLinear) and isinstance(model.lm_head, PackedHead)
    assert model.lm_head.weight is model.model.embed.weight
    assert "lm_head.panels" not in model.state_dict()
    torch.testing.assert_close(model.model.proj(x), want, rtol=1e-5, atol=1e-4)
    # Every panel tensor now lives in the one huge-page mapping, from its 2 MiB boundary.
    arena = model.panel_arena
    base = torch.frombuffer(arena, dtype=torch.float32).data_ptr()
    ptrs = [model.model.proj.panels.data_ptr(), model.lm_head.panels.data_ptr()]
    ptrs.append(model.lm_head.screen.panels.data_ptr())
    assert all(base <= p < base + len(arena) for p in ptrs)
    assert min(ptrs) % cpu.HUGE_PAGE == 0 and all(p % 64 == 0 for p in ptrs)


def _tiny_layer(layer_id: int = 0, seed: int = 3):
    from types import SimpleNamespace

    from radixlm.runtime.executor.models.llama import DecoderLayer, RotaryEmbedding

    cfg = SimpleNamespace(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(seed)
    layer = DecoderLayer(cfg, layer_id, qkv_bias=True)
    for p in layer.parameters():
        p.data.normal_(0, 0.2)
    return layer, RotaryEmbedding(cfg)


def _packed_model(layer, cpu_kernels) -> nn.Module:
    holder = nn.Module()
    holder.model = nn.Module()
    holder.model.layer = layer
    holder.lm_head = nn.Linear(64, 10, bias=False)
    use_cpu_layout(holder, cpu_kernels)
    return holder


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
        packed = _packed_model(layer, cpu_kernels).model.layer
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
    from radixlm.runtime.executor.models.cpu_layout import CpuDecoderLayer, FusedDecodeStack
    from radixlm.runtime.executor.models.llama import run_in_order
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
    packed = nn.ModuleList(CpuDecoderLayer(layer, cpu_kernels) for layer in layers)
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
    from radixlm.runtime.executor.models.cpu_layout import CpuDecoderLayer, FusedDecodeStack

    with pytest.raises(ValueError, match="fused-capable"):
        FusedDecodeStack(nn.ModuleList([_tiny_layer()[0]]), cpu_kernels)  # not packed
    with pytest.raises(ValueError, match="fused-capable"):
        FusedDecodeStack(nn.ModuleList(), cpu_kernels)
    odd = CpuDecoderLayer(_tiny_layer()[0], cpu_kernels)
    odd.fused_decode = False  # e.g. a head_dim that is not a multiple of 8
    with pytest.raises(ValueError, match="fused-capable"):
        FusedDecodeStack(nn.ModuleList([odd]), cpu_kernels)


def test_other_dtypes_keep_the_input_major_layout(cpu_kernels):
    model = _tiny_tied_model().to(torch.bfloat16)
    use_cpu_layout(model, cpu_kernels)
    assert isinstance(model.model.proj, InputMajorLinear)
    assert isinstance(model.lm_head, FewRowsHead)
