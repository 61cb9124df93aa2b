"""Triton paged attention (decode, extend, tree verify, KV store) against torch_native,
and torch_native's tree verification against a dense reference."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import ForwardMode, create_attention_backend
from tests.kernels.cases import dense_reference, make_case

# Ragged batches covering prefix lengths 0, 1 and 17 and one page-crossing longer prefix.
EXTEND = ([0, 1, 17, 33], [7, 19, 1, 3])
DECODE = ([0, 1, 17, 40, 64], [1, 1, 1, 1, 1])
VERIFY = ([0, 1, 17], [4, 6, 5])
MODES = {"extend": (ForwardMode.EXTEND, *EXTEND), "decode": (ForwardMode.DECODE, *DECODE)}
MODES["verify"] = (ForwardMode.TARGET_VERIFY, *VERIFY)


def _run(name: str, case, pool=None):
    pool = pool or case.clone_pool()
    backend = create_attention_backend(name, pool, case.scaling)
    backend.init_forward_metadata(case.fb)
    return backend.forward(case.q, case.k, case.v, 0, case.fb), pool


def _assert_same_new_kv(case, pool, ref_pool) -> None:
    """Both pools hold bit-identical K and V at the step's new slots."""
    loc = case.fb.out_cache_loc
    for got, want in (
        (pool.k_buffer[0], ref_pool.k_buffer[0]),
        (pool.v_buffer[0], ref_pool.v_buffer[0]),
    ):
        torch.testing.assert_close(got[loc], want[loc], atol=0, rtol=0)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3])
def test_triton_matches_torch_native(mode, page_size, group, device):
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_case(
        fmode, prefix_lens, extend_lens, page_size=page_size, group=group, device=device
    )
    ref, ref_pool = _run("torch_native", case)
    out, pool = _run("triton", case)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    _assert_same_new_kv(case, pool, ref_pool)


@pytest.mark.parametrize("mode", ["extend", "decode"])
def test_triton_odd_head_dim_and_fp16_pool(mode, device):
    """head_dim 24 (padded to a 32-wide tile) and an fp16 KV pool under fp32 queries."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_case(
        fmode, prefix_lens, extend_lens, page_size=4, group=2, head_dim=24,
        dtype=torch.float32, device=device,
    )  # fmt: skip
    case.pool.k_buffer = [b.half() for b in case.pool.k_buffer]
    case.pool.v_buffer = [b.half() for b in case.pool.v_buffer]
    case.pool.dtype = torch.float16
    ref, _ = _run("torch_native", case)
    out, _ = _run("triton", case)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_triton_decode_long_context_splits(device):
    """Splits longer than one key tile, one request much longer than the others."""
    case = make_case(ForwardMode.DECODE, [300, 5, 129], [1, 1, 1], page_size=16, group=3)
    case = (
        case
        if device == "cpu"
        else make_case(
            ForwardMode.DECODE, [300, 5, 129], [1, 1, 1], page_size=16, group=3, device=device
        )
    )
    ref, _ = _run("torch_native", case)
    out, _ = _run("triton", case)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_torch_native_matches_dense_reference(mode):
    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_case(fmode, prefix_lens, extend_lens, page_size=16, group=3)
    out, _ = _run("torch_native", case)
    torch.testing.assert_close(out.double(), dense_reference(case), atol=1e-5, rtol=1e-5)


def test_verify_with_causal_chain_mask_equals_extend():
    """A chain of drafts under a lower-triangular custom mask is plain causal extend."""
    prefix_lens, n = [0, 1, 17], [4, 6, 5]
    extend = make_case(ForwardMode.EXTEND, prefix_lens, n, page_size=16, group=3, seed=3)
    verify = make_case(ForwardMode.TARGET_VERIFY, prefix_lens, n, page_size=16, group=3, seed=3)
    masks = [
        (torch.arange(p + m)[None, :] <= (p + torch.arange(m))[:, None]).flatten()
        for p, m in zip(prefix_lens, n)
    ]
    verify.fb.custom_mask = torch.cat(masks)
    want, _ = _run("torch_native", extend)
    got, _ = _run("torch_native", verify)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_triton_gpu_tile_sizes(mode, device):
    """The GPU launch configuration (64-wide tiles, 16 splits, most of them empty)."""
    from radixlm.kernels.triton import decode_attention, extend_attention

    fmode, prefix_lens, extend_lens = MODES[mode]
    case = make_case(fmode, prefix_lens, extend_lens, page_size=16, group=3, device=device)
    ref, pool = _run("torch_native", case)  # also stores the new K/V into `pool`
    fb, k_buf, v_buf = case.fb, pool.k_buffer[0], pool.v_buffer[0]
    if fmode is ForwardMode.DECODE:
        out = decode_attention(
            case.q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.seq_lens,
            case.scaling, num_splits=16, block_n=64,
        )  # fmt: skip
    else:
        lens = fb.extend_seq_lens
        qo_indptr = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)])
        out = extend_attention(
            case.q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.seq_lens,
            fb.extend_prefix_lens, qo_indptr, int(lens.max()), case.scaling,
            fb.custom_mask, fb.mask_indptr, block_m=64, block_n=64,
        )  # fmt: skip
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


# head_dim 64 and 128 take the 512-bit path where gemm_isa is avx512, 16 and 24 the AVX2 one
@pytest.mark.parametrize("page_size,head_dim", [(1, 16), (16, 24), (4, 64), (1, 128)])
@pytest.mark.parametrize("group", [1, 3, 5])  # 5: score tiles of three and two query heads
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("longest", [130, 1500])
@pytest.mark.parametrize("alone", [False, True])
def test_cpu_decode_kernel_matches_torch_native(
    gemm_isa, page_size, head_dim, group, threads, longest, alone
):
    """The C decode kernel reads K/V in place and equals the gather + SDPA reference, in
    a batch (a task per request, all KV heads in one pass) and alone (a task per KV head),
    on both instruction sets."""
    from radixlm.kernels.cpu_native import CpuNativeBackend

    fmode, prefix_lens, extend_lens = MODES["decode"]
    if alone:
        prefix_lens, extend_lens = [], []
    # 131 keys: several 32-key V blocks plus a ragged 4-key tail; 1501 keys: a long
    # context (47 V blocks, rows prefetched through the slot list).
    case = make_case(
        fmode, [*prefix_lens, longest], [*extend_lens, 1], page_size=page_size, group=group,
        head_dim=head_dim,
    )  # fmt: skip
    ref, ref_pool = _run("torch_native", case)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, pool = _run("cpu", case)
    finally:
        torch.set_num_threads(before)
    if not isinstance(create_attention_backend("cpu", pool, case.scaling), CpuNativeBackend):
        pytest.skip("the CPU kernels cannot be built here")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    loc = case.fb.out_cache_loc
    torch.testing.assert_close(pool.k_buffer[0][loc], ref_pool.k_buffer[0][loc], atol=0, rtol=0)


@pytest.mark.parametrize("page_size,head_dim", [(1, 16), (16, 64), (4, 24)])
@pytest.mark.parametrize("group", [1, 3, 32])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [
        EXTEND,
        ([0, 500, 3], [300, 70, 129]),  # several key and token blocks
        ([3, 40, 500, 64], [30, 2, 1, 1]),  # a mixed step: trailing decodes, decode kernel
        ([0, 17, 40], [1, 1, 1]),  # only one-token requests
        # a verify step: every request's few tokens as one-token rows of the decode
        # kernel, each request's rows sharing its keys (cascade groups from 32 keys on)
        ([40, 500, 64, 3], [4, 5, 16, 2]),
        ([0, 300, 70], [40, 17, 3]),  # 17 tokens end the trailing run: the extend kernel
    ],
)
def test_cpu_extend_kernel_matches_torch_native(
    gemm_isa, page_size, head_dim, group, threads, prefix_lens, extend_lens
):
    """The C extend kernel (head_dim % 16 == 0; 24 takes torch_native's path) equals the
    per-request SDPA reference: causal over the cached prefix and the new tokens."""
    from radixlm.kernels.cpu_native import CpuNativeBackend

    case = make_case(
        ForwardMode.EXTEND, prefix_lens, extend_lens, page_size=page_size, group=group,
        head_dim=head_dim, kv_heads=1 if group == 32 else 2,
    )  # fmt: skip
    ref, _ = _run("torch_native", case)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        backend = create_attention_backend("cpu", case.clone_pool(), case.scaling)
        if not isinstance(backend, CpuNativeBackend):
            pytest.skip("the CPU kernels cannot be built here")
        assert (backend.forward_extend == backend._extend_kernel) == (head_dim % 16 == 0)
        out, _ = _run("cpu", case)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def test_cpu_extend_kernel_rejects_bad_lengths(cpu_kernels):
    k = torch.zeros(8, 1, 16)
    q, slots = torch.zeros(3, 1, 16), torch.zeros(1, 4, dtype=torch.int64)
    seq = torch.tensor([4])
    with pytest.raises(ValueError, match="sum to"):
        cpu_kernels.extend_attention(q, k, k, slots, seq, torch.tensor([2]), 1.0)
    with pytest.raises(ValueError, match="in \\[1, seq_lens\\]"):
        cpu_kernels.extend_attention(q, k, k, slots, torch.tensor([2]), torch.tensor([3]), 1.0)
    with pytest.raises(ValueError, match="D % 16"):
        k24 = torch.zeros(8, 1, 24)
        cpu_kernels.extend_attention(torch.zeros(3, 1, 24), k24, k24, slots, seq, seq - 1, 1.0)


def test_cpu_backend_falls_back_for_bfloat16_pools():
    from radixlm.kernels.torch_native import TorchNativeBackend

    case = make_case(ForwardMode.DECODE, [3], [1])
    case.pool.k_buffer = [b.bfloat16() for b in case.pool.k_buffer]
    case.pool.v_buffer = [b.bfloat16() for b in case.pool.v_buffer]
    backend = create_attention_backend("cpu", case.pool, case.scaling)
    assert type(backend) is TorchNativeBackend


def _half_pool(case):
    """The case with its KV pool in float16 (q, k, v stay float32)."""
    case.pool.k_buffer = [b.half() for b in case.pool.k_buffer]
    case.pool.v_buffer = [b.half() for b in case.pool.v_buffer]
    case.pool.dtype = torch.float16
    return case


# The float16 pool's cases: the extend and decode modes, each with a longer request, and a
# verify step's few new tokens per request after long prefixes (one-token decode rows).
FLOAT16 = {
    "extend": (ForwardMode.EXTEND, [*EXTEND[0], 300], [*EXTEND[1], 40]),
    "decode": (ForwardMode.DECODE, [*DECODE[0], 300], [*DECODE[1], 1]),
    "few": (ForwardMode.EXTEND, [300, 45, 7], [5, 3, 16]),
}


@pytest.mark.parametrize("mode", sorted(FLOAT16))
@pytest.mark.parametrize("page_size,group", [(1, 1), (16, 3), (4, 3)])
@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_kernels_on_float16_pools_match_torch_native(gemm_isa, mode, page_size, group, threads):
    """--kv-cache-dtype float16: the C store rounds K/V to float16 exactly as torch does
    (nearest even), and the C attention over the float16 pool (computed in fp32) equals
    torch_native's over the same pool."""
    from radixlm.kernels.cpu_native import CpuNativeBackend

    fmode, prefix_lens, extend_lens = FLOAT16[mode]
    case = _half_pool(
        make_case(fmode, prefix_lens, extend_lens, page_size=page_size, group=group, head_dim=64)
    )
    ref, ref_pool = _run("torch_native", case)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if not isinstance(
            create_attention_backend("cpu", case.pool, case.scaling), CpuNativeBackend
        ):
            pytest.skip("the CPU kernels cannot be built here")
        out, pool = _run("cpu", case)
    finally:
        torch.set_num_threads(before)
    assert pool.k_buffer[0].dtype == torch.float16
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    _assert_same_new_kv(case, pool, ref_pool)


def test_cpu_backend_falls_back_for_head_dims_outside_the_kernel():
    from radixlm.kernels.torch_native import TorchNativeBackend

    case = make_case(ForwardMode.DECODE, [3], [1], head_dim=12)
    assert type(create_attention_backend("cpu", case.pool, case.scaling)) is TorchNativeBackend
    case = make_case(ForwardMode.DECODE, [3], [1], kv_heads=2, head_dim=16)
    backend = create_attention_backend("cpu", case.pool, case.scaling, num_heads=3)
    assert type(backend) is TorchNativeBackend  # 3 query heads on 2 KV heads
