"""Multi-head latent attention over a latent pool (one KV head; K = [latent ; rope key], V
the view of each K row's latent) and, generally, V narrower than K, on every backend:
torch_native against a dense fp64 reference, the CPU kernels and the Triton kernels
(TRITON_INTERPRET=1, small shapes) against torch_native."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import ForwardMode, create_attention_backend
from tests.kernels.cases import dense_reference
from tests.kernels.latent_cases import LatentPool, make_latent_case, separate_values

EXTEND = (ForwardMode.EXTEND, [0, 1, 17, 33], [7, 19, 1, 3])
DECODE = (ForwardMode.DECODE, [0, 1, 17, 40, 64], [1, 1, 1, 1, 1])
VERIFY = (ForwardMode.TARGET_VERIFY, [0, 1, 17], [4, 6, 5])
MODES = {"extend": EXTEND, "decode": DECODE, "verify": VERIFY}
#: (H, R, Dr): every head count, rank and rope width of the contract, crossed.
SHAPES = [(h, r, dr) for h in (1, 4, 16) for r in (16, 32, 512) for dr in (8, 64)]


def _run(name: str, case, **info):
    pool = case.clone_pool()
    backend = create_attention_backend(name, pool, case.scaling, **info)
    backend.init_forward_metadata(case.fb)
    return backend.forward(case.q, case.k, case.v, 0, case.fb), pool, backend


def _cpu_or_skip(case, **info):
    from radixlm.kernels.cpu_native import CpuNativeBackend

    out, pool, backend = _run("cpu", case, **info)
    if not isinstance(backend, CpuNativeBackend):
        pytest.skip("the CPU kernels cannot be built here")
    return out, pool, backend


def _half(case, dtype):
    """The case with its latent pool in `dtype` and the new K rounded to it (the model
    stores K in the pool's dtype; q stays float32)."""
    case.pool = LatentPool([b.to(dtype) for b in case.pool.k_buffer], case.pool.rank)
    case.k = case.k.to(dtype).float()
    case.v = case.k[:, :, : case.pool.rank]
    return case


def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads,rank,rope", SHAPES)
def test_torch_native_latent_pool_matches_dense_reference(mode, page_size, heads, rank, rope):
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_latent_case(
        fmode, prefix_lens, extend_lens, heads=heads, rank=rank, rope_dim=rope,
        page_size=page_size,
    )  # fmt: skip
    out, pool, backend = _run("torch_native", case)
    assert backend.latent_values and out.shape == (case.q.shape[0], heads, rank)
    torch.testing.assert_close(out.double(), dense_reference(case), atol=1e-5, rtol=1e-5)
    loc = case.fb.out_cache_loc  # K stored; V, its view, reads the latent back
    assert torch.equal(pool.k_buffer[0][loc], case.k)
    assert torch.equal(pool.v_buffer[0][loc], case.k[:, :, :rank])


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("heads,rank,rope", [(4, 32, 8), (16, 512, 64)])
def test_torch_native_bfloat16(mode, heads, rank, rope):
    """bf16 queries over a bf16 latent pool: SDPA in bf16 against the fp64 reference of
    the same bf16 values; the cpu backend serves it by torch_native."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_latent_case(
        fmode, prefix_lens, extend_lens, heads=heads, rank=rank, rope_dim=rope,
        page_size=16, dtype=torch.bfloat16,
    )  # fmt: skip
    out, _, _ = _run("torch_native", case)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_reference(case), atol=2e-2, rtol=2e-2)
    cpu_out, _, cpu = _run("cpu", case)  # bf16 pools are outside the C kernels
    assert type(cpu).__name__ == "TorchNativeBackend" and torch.equal(cpu_out, out)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_torch_native_separate_narrow_values(mode):
    """Dv != Dk with V in a buffer of its own (not a view): both stored and read."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = separate_values(
        make_latent_case(fmode, prefix_lens, extend_lens, heads=4, rank=32, rope_dim=16)
    )
    out, pool, backend = _run("torch_native", case)
    assert not backend.latent_values
    torch.testing.assert_close(out.double(), dense_reference(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads,rank,rope", SHAPES)
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_cpu_latent_pool_matches_torch_native(mode, page_size, heads, rank, rope, kv_dtype):
    """The C kernels over a latent pool: decode by decode_attention_mla.c, extend by
    extend_attention.c (Dk % 16 == 0; else torch_native's), verify by torch_native; float32
    and float16 pools."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_latent_case(
        fmode, [*prefix_lens, 300], [*extend_lens, 1 if mode == "decode" else 40],
        heads=heads, rank=rank, rope_dim=rope, page_size=page_size,
    )  # fmt: skip
    case = _half(case, kv_dtype)
    ref, ref_pool, _ = _run("torch_native", case)
    out, pool, backend = _cpu_or_skip(case, num_heads=heads)
    assert backend.fused_decode_tables(case.fb) is None
    assert backend.extend_kernel == ((rank + rope) % 16 == 0 and rank % 16 == 0)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    loc = case.fb.out_cache_loc
    assert torch.equal(pool.k_buffer[0][loc], ref_pool.k_buffer[0][loc])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize("heads", [1, 16])
def test_cpu_mla_decode_long_contexts_and_splits(threads, window, heads):
    """Contexts of one to several key splits (256 keys each at least) and blocks, alone
    (batch 1: keys split across threads) and in a batch, with and without a sliding
    window; against torch_native with the same window."""
    for prefix_lens in ([1500], [1500, 3, 700, 33]):
        case = make_latent_case(
            ForwardMode.DECODE, prefix_lens, [1] * len(prefix_lens), heads=heads, rank=512,
            rope_dim=64, page_size=16,
        )  # fmt: skip
        windows = [window or None]
        ref = create_attention_backend(
            "torch_native", case.clone_pool(), case.scaling, sliding_windows=windows
        )
        ref.init_forward_metadata(case.fb)
        want = ref.forward(case.q, case.k, case.v, 0, case.fb)
        before = _threads(threads)
        try:
            backend = create_attention_backend(
                "cpu", case.clone_pool(), case.scaling, sliding_windows=windows
            )
            backend.init_forward_metadata(case.fb)
            got = backend.forward(case.q, case.k, case.v, 0, case.fb)
        finally:
            torch.set_num_threads(before)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, 20])
def test_cpu_extend_latent_pool_with_window_and_trailing_decodes(window):
    """A mixed step (its one-token requests go to the MLA decode kernel) under a sliding
    window, extend by the C kernel."""
    case = make_latent_case(
        ForwardMode.EXTEND, [3, 40, 500, 64], [30, 2, 1, 1], heads=4, rank=32, rope_dim=64,
        page_size=16,
    )  # fmt: skip
    windows = [window or None]
    outs = []
    for name in ("torch_native", "cpu"):
        backend = create_attention_backend(
            name, case.clone_pool(), case.scaling, sliding_windows=windows
        )
        backend.init_forward_metadata(case.fb)
        outs.append(backend.forward(case.q, case.k, case.v, 0, case.fb))
    torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_cpu_separate_narrow_values(mode):
    """Dv != Dk with V in a contiguous buffer of its own: the MLA decode kernel reads it at
    its own stride, the extend kernel likewise; the pool's set_kv stores both."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = separate_values(
        make_latent_case(fmode, prefix_lens, extend_lens, heads=6, rank=32, rope_dim=16)
    )
    ref, _, _ = _run("torch_native", case)
    out, pool, backend = _cpu_or_skip(case)
    assert not backend.latent_values and not backend.plain_pool
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    assert torch.equal(pool.v_buffer[0][case.fb.out_cache_loc], case.v)


def test_cpu_kernels_reject_values_they_cannot_read(cpu_kernels):
    k = torch.zeros(8, 2, 32)
    q, slots, seq = torch.zeros(1, 4, 32), torch.zeros(1, 4, dtype=torch.int64), torch.tensor([4])
    with pytest.raises(ValueError, match="unsupported V buffer"):  # heads not contiguous
        cpu_kernels.decode_attention(q, k, k[:, :, :16], slots, seq, 1.0)
    with pytest.raises(ValueError, match="unsupported V buffer"):  # Dv % 8 != 0
        cpu_kernels.decode_attention(q, k, torch.zeros(8, 2, 12), slots, seq, 1.0)
    with pytest.raises(ValueError, match="D % 16"):
        latent = torch.zeros(8, 1, 32)
        cpu_kernels.extend_attention(q, latent, latent[:, :, :8], slots, seq, seq, 1.0)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads,rank,rope", [(1, 16, 8), (4, 32, 8), (17, 16, 8)])
def test_triton_latent_pool_matches_torch_native(mode, page_size, heads, rank, rope, device):
    """Triton over a latent pool: decode by the MLA kernel (17 heads: two head blocks),
    extend and verify by the general kernels reading V through the view; the store writes
    K alone."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_latent_case(
        fmode, prefix_lens, extend_lens, heads=heads, rank=rank, rope_dim=rope,
        page_size=page_size, device=device,
    )  # fmt: skip
    case.pool = LatentPool([b.to(device) for b in case.pool.k_buffer], rank)
    ref, ref_pool, _ = _run("torch_native", case)
    out, pool, backend = _run("triton", case)
    assert backend._mla_decode
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    loc = case.fb.out_cache_loc
    assert torch.equal(pool.k_buffer[0][loc], ref_pool.k_buffer[0][loc])


def test_triton_mla_decode_bfloat16_pool_window_and_gpu_tiles(device):
    """A bf16 latent pool under fp32 queries, a sliding window, and the GPU tile sizes
    (32-key tiles, 16 splits, most of them empty), against torch_native on the same pool."""
    from radixlm.kernels.triton import mla_decode_attention

    fmode, prefix_lens, extend_lens = DECODE
    case = make_latent_case(
        fmode, [*prefix_lens, 130], [*extend_lens, 1], heads=4, rank=32, rope_dim=8,
        page_size=16,
    )  # fmt: skip
    case = _half(case, torch.bfloat16)
    ref = create_attention_backend(
        "torch_native", case.pool, case.scaling, sliding_windows=[40]
    )  # the new K stored into case.pool here
    ref.init_forward_metadata(case.fb)
    want = ref.forward(case.q, case.k, case.v, 0, case.fb).to(device)
    fb = case.fb.to(device)
    for window, splits, block_n in ((40, 4, None), (0, 16, 32)):
        if not window:
            nowin = create_attention_backend("torch_native", case.pool, case.scaling)
            nowin.init_forward_metadata(case.fb)
            want = nowin.forward_decode(case.q, 0, case.fb).to(device)
        got = mla_decode_attention(
            case.q.to(device), case.pool.k_buffer[0].to(device), 32, fb.req_to_token,
            fb.req_pool_indices, fb.seq_lens, case.scaling, splits, block_n=block_n,
            window=window,
        )  # fmt: skip
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_triton_separate_narrow_values(mode, device):
    """Dv != Dk with V in a buffer of its own: the general kernels and the two-width store."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = separate_values(
        make_latent_case(fmode, prefix_lens, extend_lens, heads=3, rank=16, rope_dim=8)
    )
    ref, ref_pool, _ = _run("torch_native", case)
    out, pool, backend = _run("triton", case)
    assert not backend._mla_decode
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    loc = case.fb.out_cache_loc
    assert torch.equal(pool.v_buffer[0][loc], ref_pool.v_buffer[0][loc])


def test_flashinfer_refuses_latent_pools(monkeypatch):
    import sys

    from tests.kernels import fake_flashinfer

    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    case = make_latent_case(ForwardMode.DECODE, [3], [1], heads=4, rank=32, rope_dim=8)
    with pytest.raises(ValueError, match="V rows shaped like K rows"):
        create_attention_backend("flashinfer", case.pool, case.scaling, num_heads=4)
