"""Sliding-window attention in every backend (torch_native, cpu's C kernels, Triton under
the interpreter, FlashInfer through its torch stand-in) against a dense masked softmax
written here: extend with and without a cached prefix, decode below / at / above the
window, mixed steps, tree verify, a windowed and a full layer in one pool."""

from __future__ import annotations

import sys

import pytest
import torch

from radixlm.kernels import ForwardMode, create_attention_backend
from tests.kernels import fake_flashinfer
from tests.kernels.cases import make_case

W = 8
CASES = {
    # no cached prefix: prompts longer than, as long as, and shorter than the window
    "extend": (ForwardMode.EXTEND, [0, 0, 0], [20, 8, 3]),
    # prefix hits / chunked prefill (p > 0), with trailing one-token requests (mixed step)
    "prefix": (ForwardMode.EXTEND, [13, 30, 3, 7, 2], [7, 2, 9, 1, 1]),
    # decode: sequence lengths 3, 8, 9 and 41 (below, at, one past and well past W)
    "decode": (ForwardMode.DECODE, [2, 7, 8, 40], [1, 1, 1, 1]),
    "verify": (ForwardMode.TARGET_VERIFY, [0, 5, 17], [4, 6, 5]),
}
BACKENDS = ["torch_native", "cpu", "triton", "flashinfer"]


def dense(case, layer: int, window: int | None) -> torch.Tensor:
    """fp64 [T, H, D]: every new token's attention over its request's keys of `layer`
    (gathered from the table after storing the new K/V) under the causal or tree mask and,
    with a window, only keys k with positions[token] - k < window."""
    fb = case.fb.to("cpu")
    k_buf = case.pool.k_buffer[layer].cpu().double()
    v_buf = case.pool.v_buffer[layer].cpu().double()
    k_buf[fb.out_cache_loc], v_buf[fb.out_cache_loc] = case.k.cpu().double(), case.v.cpu().double()
    q = case.q.cpu().double()
    group = q.shape[1] // k_buf.shape[1]
    out = torch.empty_like(q)
    start, mask_at = 0, 0
    for b in range(fb.batch_size):
        p, n = int(fb.extend_prefix_lens[b]), int(fb.extend_seq_lens[b])
        s = p + n
        slots = fb.req_to_token[fb.req_pool_indices[b], :s].long()
        keys = k_buf[slots].repeat_interleave(group, 1)
        vals = v_buf[slots].repeat_interleave(group, 1)
        pos = fb.positions[start : start + n]
        key_idx = torch.arange(s)
        if fb.custom_mask is not None:
            visible = fb.custom_mask[mask_at : mask_at + n * s].view(n, s).bool()
            mask_at += n * s
        else:
            visible = key_idx[None, :] <= pos[:, None]
        if window is not None:
            visible = visible & (pos[:, None] - key_idx[None, :] < window)
        scores = torch.einsum("nhd,shd->hns", q[start : start + n], keys) * case.scaling
        probs = scores.masked_fill(~visible[None], float("-inf")).softmax(-1)
        out[start : start + n] = torch.einsum("hns,shd->nhd", probs, vals)
        start += n
    return out


def tree_positions(case) -> None:
    """A verify case's draft positions made p + depth (depth from its tree mask), as the
    speculative runtime sets them."""
    fb = case.fb
    pos, start, at = [], 0, 0
    for p, n in zip(fb.extend_prefix_lens.tolist(), fb.extend_seq_lens.tolist()):
        mask = fb.custom_mask[at : at + n * (p + n)].view(n, p + n)
        at += n * (p + n)
        pos.append(p + mask[:, p:].sum(1) - 1)
        start += n
    fb.positions = torch.cat(pos).to(fb.positions)


def build(name, case, windows, page_size):
    info = dict(num_heads=case.q.shape[1], page_size=page_size, dtype=case.q.dtype)
    backend = create_attention_backend(
        name, case.clone_pool(), case.scaling, sliding_windows=windows, **info
    )
    if name == "cpu":
        from radixlm.kernels.cpu_native import CpuNativeBackend

        if not isinstance(backend, CpuNativeBackend):
            pytest.skip("the CPU kernels cannot be built here")
    backend.init_forward_metadata(case.fb)
    return backend


def run_layers(backend, case) -> list[torch.Tensor]:
    n = len(backend.sliding_windows)
    return [backend.forward(case.q, case.k, case.v, i, case.fb) for i in range(n)]


@pytest.fixture
def setup(request, monkeypatch):
    """(device, tolerance) for a backend; installs the FlashInfer stand-in."""
    name = request.param
    if name == "flashinfer":
        monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    device = request.getfixturevalue("device") if name == "triton" else "cpu"
    return name, device


@pytest.mark.parametrize("setup", BACKENDS, indirect=True)
@pytest.mark.parametrize("mode", sorted(CASES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3])
def test_windowed_and_full_layers_match_dense_reference(setup, mode, page_size, group):
    name, device = setup
    fmode, prefix_lens, extend_lens = CASES[mode]
    case = make_case(
        fmode, prefix_lens, extend_lens, page_size=page_size, group=group, num_layers=3,
        device=device,
    )  # fmt: skip
    if fmode is ForwardMode.TARGET_VERIFY:
        tree_positions(case)
    windows = [W, None, 1]
    outs = run_layers(build(name, case, windows, page_size), case)
    for layer, window in enumerate(windows):
        torch.testing.assert_close(
            outs[layer].cpu().double(), dense(case, layer, window), atol=1e-4, rtol=1e-4
        )
    # A layer without a window runs exactly as in a backend without windows.
    plain = run_layers(build(name, case, None, page_size), case)
    torch.testing.assert_close(outs[1], plain[1], atol=0, rtol=0)


LONG = {
    "extend": (ForwardMode.EXTEND, [0, 70, 3], [130, 40, 1], 50),
    "decode": (ForwardMode.DECODE, [300, 5, 129], [1, 1, 1], 100),
    "verify": (ForwardMode.TARGET_VERIFY, [0, 5, 100], [4, 6, 5], 50),
}


@pytest.mark.parametrize("mode", sorted(LONG))
def test_triton_windows_at_gpu_tile_sizes(mode, device):
    """The GPU launch configuration (64-wide tiles, 16 splits) with windows that start
    inside a request's keys, past its first tiles."""
    from radixlm.kernels.triton import decode_attention, extend_attention

    fmode, prefix_lens, extend_lens, window = LONG[mode]
    case = make_case(fmode, prefix_lens, extend_lens, page_size=16, group=3, device=device)
    if fmode is ForwardMode.TARGET_VERIFY:
        tree_positions(case)
    pool = case.clone_pool()
    fb = case.fb
    pool.set_kv(0, fb.out_cache_loc, case.k, case.v)
    k_buf, v_buf = pool.k_buffer[0], pool.v_buffer[0]
    if fmode is ForwardMode.DECODE:
        out = decode_attention(
            case.q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.seq_lens,
            case.scaling, num_splits=16, block_n=64, window=window,
        )  # fmt: skip
    else:
        lens = fb.extend_seq_lens
        qo_indptr = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)])
        out = extend_attention(
            case.q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.seq_lens,
            fb.extend_prefix_lens, qo_indptr, int(lens.max()), case.scaling,
            fb.custom_mask, fb.mask_indptr, block_m=64, block_n=64, window=window,
            positions=fb.positions,
        )  # fmt: skip
    torch.testing.assert_close(out.cpu().double(), dense(case, 0, window), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("head_dim,page_size", [(16, 1), (64, 16), (128, 4)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [
        ([0, 500, 3], [300, 70, 129]),  # several key blocks and token blocks per request
        ([3, 40, 500, 64], [30, 2, 1, 1]),  # trailing decodes go to the decode kernel
        ([0, 17, 40, 1000], [1, 1, 1, 1]),  # decode: one long request
    ],
)
def test_cpu_kernels_long_windows(gemm_isa, head_dim, page_size, threads, half, prefix_lens,
                                  extend_lens):  # fmt: skip
    """The C kernels with windows across their key blocks (64 keys), token blocks, the
    512-bit paths (head_dim 64, 128) and float16 pools."""
    mode = ForwardMode.DECODE if set(extend_lens) == {1} else ForwardMode.EXTEND
    case = make_case(
        mode, prefix_lens, extend_lens, page_size=page_size, group=3, head_dim=head_dim,
        num_layers=2,
    )  # fmt: skip
    if half:
        case.pool.k_buffer = [b.half() for b in case.pool.k_buffer]
        case.pool.v_buffer = [b.half() for b in case.pool.v_buffer]
        case.pool.dtype = torch.float16
    windows = [100, 70]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = run_layers(build("cpu", case, windows, page_size), case)
    finally:
        torch.set_num_threads(before)
    if half:  # the reference reads the float16 pool's values (stored K/V rounded too)
        case.k, case.v = case.k.half().float(), case.v.half().float()
    for layer, window in enumerate(windows):
        torch.testing.assert_close(
            outs[layer].double(), dense(case, layer, window), atol=2e-5, rtol=1e-5
        )


def test_cpu_decode_window_over_a_shared_prefix(gemm_isa):
    """Requests sharing 35 cached slots: the full layer takes the cascade path over them,
    the windowed one (whose windows start inside and past the shared part) must not."""
    case = make_case(ForwardMode.DECODE, [40, 50, 60], [1, 1, 1], group=3, head_dim=64,
                     num_layers=2)  # fmt: skip
    table, rows = case.fb.req_to_token, case.fb.req_pool_indices
    table[rows[1], :35] = table[rows[0], :35]
    table[rows[2], :35] = table[rows[0], :35]
    windows = [20, None]
    outs = run_layers(build("cpu", case, windows, 1), case)
    for layer, window in enumerate(windows):
        torch.testing.assert_close(
            outs[layer].double(), dense(case, layer, window), atol=2e-5, rtol=1e-5
        )


def test_flashinfer_graph_decode_keeps_a_wrapper_per_window(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    fmode, prefix_lens, extend_lens = CASES["decode"]
    case = make_case(fmode, prefix_lens, extend_lens, page_size=16, group=3, num_layers=3)
    windows = [W, None, W]
    backend = create_attention_backend(
        "flashinfer", case.clone_pool(), case.scaling, num_heads=6, page_size=16,
        sliding_windows=windows,
    )  # fmt: skip
    backend.init_cuda_graph_state(8, case.fb.req_to_token.shape[1])
    backend.init_forward_metadata_cuda_graph(case.fb)
    assert sorted(backend._graph_decode[case.fb.batch_size], key=str) == [8, None]
    outs = run_layers(backend, case)
    for layer, window in enumerate(windows):
        torch.testing.assert_close(
            outs[layer].double(), dense(case, layer, window), atol=1e-5, rtol=1e-5
        )


def test_cpu_fused_stack_declines_windowed_models():
    case = make_case(ForwardMode.DECODE, [3, 9], [1, 1], num_layers=2)
    assert build("cpu", case, None, 1).fused_decode_tables(case.fb) is not None
    assert build("cpu", case, [None, 4], 1).fused_decode_tables(case.fb) is None


@pytest.mark.parametrize("name", ["torch_native", "cpu", "triton", "flashinfer"])
def test_every_factory_passes_the_windows_on(name, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    case = make_case(ForwardMode.DECODE, [3], [1], num_layers=2)
    backend = create_attention_backend(
        name, case.pool, case.scaling, num_heads=2, sliding_windows=[None, 4]
    )
    assert backend.sliding_windows == (None, 4)
    assert create_attention_backend(name, case.pool, case.scaling, num_heads=2).sliding_windows == (
        None,
        None,
    )


def test_cpu_fallback_keeps_the_windows():
    case = make_case(ForwardMode.DECODE, [3], [1], num_layers=2)
    case.pool.k_buffer = [b.bfloat16() for b in case.pool.k_buffer]
    backend = create_attention_backend("cpu", case.pool, case.scaling, sliding_windows=[4, 5])
    assert backend.sliding_windows == (4, 5)


def test_bad_windows_are_refused():
    case = make_case(ForwardMode.DECODE, [3], [1], num_layers=2)
    with pytest.raises(ValueError, match="1 sliding windows given for 2 layers"):
        create_attention_backend("torch_native", case.pool, 1.0, sliding_windows=[4])
    with pytest.raises(ValueError, match=">= 1"):
        create_attention_backend("torch_native", case.pool, 1.0, sliding_windows=[0, None])
