"""radixlm's C kernels for CPU equal their torch references: the packed GEMM for every row
tile, K block and ragged N; RMSNorm, silu * mul, RoPE and the KV store (decode attention
is compared with torch_native in test_attention.py)."""

from __future__ import annotations

import subprocess

import pytest
import torch
import torch.nn.functional as F

import radixlm.kernels.cpu as cpu
import radixlm.kernels.cpu.build as cpu_build
import radixlm.kernels.cpu.weights as cpu_weights
from radixlm.kernels.cpu import CpuKernels, pack_panels
from radixlm.runtime.executor.layers.blocks import RMSNorm, apply_rotary


def test_pack_panels_layout():
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    p = pack_panels(w)
    assert p.shape == (2, 3, 16)
    assert torch.equal(p[0], w[:16].t())
    assert torch.equal(p[1, :, :4], w[16:].t())
    assert not p[1, :, 4:].any()  # zero padding


# AVX2: rows cover the interleaved weight streams of 1-6 rows (1000 x 576: a ragged last
# panel in the last stream), balanced splits of 7-11 rows with K blocking (K > 128), and
# the packed-x path of balanced tiles of up to 6 rows from 12 rows (13: 5 + 4 + 4).
# AVX-512 (packed x for every row count): balanced tiles of up to 12 rows over one or two
# panels. Both: one and several 144-row blocks, a short last tile. N covers exact panels
# (even and odd counts), a ragged last panel and N < 16; K covers one and several
# 576-deep blocks of the packed-x path.
@pytest.mark.parametrize(
    "m,n,k",
    [
        (m, n, k)
        for m in (1, 2, 3, 5, 6, 7, 13, 40)
        for n, k in ((64, 32), (200, 300), (7, 129), (1000, 576))
    ]
    + [
        (m, n, k)
        for m in (12, 16, 25, 32, 145, 301)
        for n, k in ((37, 1300), (48, 577), (200, 1152), (80, 64))
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_torch(cpu_kernels, gemm_isa, m, n, k, threads):
    torch.manual_seed(m * 1000 + n + k)
    w, x = torch.randn(n, k), torch.randn(m, k)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = cpu_kernels.mm(x, pack_panels(w), n)
    finally:
        torch.set_num_threads(before)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("m", "n"), [(1, 200), (1, 3000), (127, 200), (128, 200), (301, 200)])
def test_threads_split_rows_or_panels_with_the_same_bits(cpu_kernels, gemm_isa, m, n):
    # 2 threads split the panels below 128 rows (one row: the last eighth two panels at a
    # time) and the rows from there on; each row's sums run in the same order either way,
    # so they equal one thread's bit for bit.
    torch.manual_seed(m + n)
    w, x = torch.randn(n, 1152), torch.randn(m, 1152)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(cpu_kernels.mm(x, pack_panels(w), n))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], x @ w.t(), rtol=1e-5, atol=1e-4)


def test_gemm_isa_defaults_to_avx512_where_the_cpu_has_it(cpu_kernels):
    has_avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    assert cpu_kernels.gemm_isa() == ("avx512" if has_avx512 else "avx2")


def test_into_huge_pages_copies_into_one_aligned_mapping():
    a, b = torch.randn(3, 5), torch.randn(7)
    arena, (ca, cb) = cpu.into_huge_pages([a, b])
    assert torch.equal(ca, a) and torch.equal(cb, b) and ca.shape == a.shape
    assert ca.data_ptr() % cpu.HUGE_PAGE == 0 and cb.data_ptr() == ca.data_ptr() + 64
    ca.add_(1)  # views of the mapping, not of the originals
    assert torch.equal(ca, a + 1)
    # Any dtype: quantized panels are uint8; each tensor starts on a 64-byte boundary.
    q = torch.arange(100, dtype=torch.uint8)
    arena2, (cq, ca2) = cpu.into_huge_pages([q, a])
    assert torch.equal(cq, q) and torch.equal(ca2, a) and ca2.data_ptr() == cq.data_ptr() + 128
    assert cpu.into_huge_pages([]) == (None, [])


def test_into_huge_pages_keeps_the_tensors_when_the_kernel_refuses(monkeypatch):
    import mmap
    from types import SimpleNamespace

    class NoHugePages(mmap.mmap):
        def madvise(self, *args):
            raise OSError(22, "Invalid argument")

    fake = SimpleNamespace(**{n: getattr(mmap, n) for n in dir(mmap) if n.isupper()})
    fake.mmap = NoHugePages
    monkeypatch.setattr(cpu_weights, "mmap", fake)
    a = torch.randn(4)
    assert cpu.into_huge_pages([a]) == (None, [a])


def test_non_contiguous_input_and_zero_rows(cpu_kernels):
    w = torch.randn(48, 40)
    x = torch.randn(40, 6).t()  # [6, 40], not contiguous
    torch.testing.assert_close(
        cpu_kernels.mm(x, pack_panels(w), 48), x @ w.t(), rtol=1e-5, atol=1e-4
    )
    assert cpu_kernels.mm(torch.empty(0, 40), pack_panels(w), 48).shape == (0, 48)


def test_bad_input_is_a_value_error(cpu_kernels):
    p = pack_panels(torch.randn(32, 8))
    with pytest.raises(ValueError, match="fp32 only"):
        cpu_kernels.mm(torch.randn(2, 8, dtype=torch.float64), p, 32)
    with pytest.raises(ValueError, match="K=9"):
        cpu_kernels.mm(torch.randn(2, 9), p, 32)


def test_build_failure_falls_back_to_none(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setattr(cpu_build, "unsupported_reason", lambda: None)
    assert CpuKernels.load.__wrapped__() is None  # uncached: really tries to build
    assert not list(tmp_path.glob("*.so"))


def test_build_is_cached(monkeypatch, tmp_path, cpu_kernels):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    so = cpu_build.build()
    assert so.parent == tmp_path and so.exists()
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    assert cpu_build.build() == so and not calls


@pytest.mark.parametrize("rows,dim", [(1, 576), (3, 100), (300, 576)])  # 300 x 576: threaded
def test_rms_norm(cpu_kernels, rows, dim):
    torch.manual_seed(rows)
    norm = RMSNorm(dim, 1e-5)
    norm.weight.data.normal_()
    x = torch.randn(rows, 2 * dim)[:, :dim]  # strided rows
    torch.testing.assert_close(
        cpu_kernels.rms_norm(x, norm.weight, 1e-5), norm(x), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("rows,n", [(1, 1536), (5, 37), (64, 1536)])
def test_silu_mul(cpu_kernels, rows, n):
    torch.manual_seed(n)
    gu = torch.randn(rows, 2 * n) * 6  # saturates both tails of silu
    want = F.silu(gu[:, :n]) * gu[:, n:]
    torch.testing.assert_close(cpu_kernels.silu_mul(gu), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,heads,head_dim", [(1, 12, 64), (6, 5, 24), (200, 12, 64)])
def test_rope_in_place(cpu_kernels, rows, heads, head_dim):
    torch.manual_seed(heads)
    x = torch.randn(rows, (heads + 2) * head_dim)  # two trailing (v) heads stay untouched
    cos, sin = torch.randn(rows, 1, head_dim), torch.randn(rows, 1, head_dim)
    want = apply_rotary(x[:, : heads * head_dim].view(rows, heads, head_dim), cos, sin)
    tail = x[:, heads * head_dim :].clone()
    cpu_kernels.rope_(x, heads, head_dim, cos, sin)
    torch.testing.assert_close(
        x[:, : heads * head_dim].view(rows, heads, head_dim), want, rtol=1e-5, atol=1e-5
    )
    assert torch.equal(x[:, heads * head_dim :], tail)
    with pytest.raises(ValueError, match="cannot hold"):
        cpu_kernels.rope_(x, heads + 3, head_dim, cos, sin)


def test_store_kv_from_strided_views(cpu_kernels):
    k_buf, v_buf = torch.zeros(20, 2, 8), torch.zeros(20, 2, 8)
    qkv = torch.randn(3, 48)  # k and v are column slices of a fused row, as in PackedAttention
    k, v = qkv[:, 16:32].view(3, 2, 8), qkv[:, 32:].view(3, 2, 8)
    loc = torch.tensor([5, 0, 19])
    cpu_kernels.store_kv(k, v, k_buf, v_buf, loc)
    assert torch.equal(k_buf[loc], k) and torch.equal(v_buf[loc], v)
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[loc] = False
    assert not k_buf[untouched].any() and not v_buf[untouched].any()
    with pytest.raises(ValueError, match="loc int64"):
        cpu_kernels.store_kv(k, v, k_buf, v_buf, loc.int())


def _dense_decode(q, k_buf, v_buf, slots, lens, scale):
    """Reference: softmax(scale q K^T) V per request over its slots (GQA by repeat)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_buf.shape[1]
    for b in range(q.shape[0]):
        idx = slots[b, : lens[b]]
        k = k_buf[idx].repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_buf[idx].repeat_interleave(group, dim=1)
        p = torch.softmax(scale * torch.einsum("hd,lhd->hl", q[b], k), dim=-1)
        out[b] = torch.einsum("hl,lhd->hd", p, v)
    return out


def test_decode_attention_many_query_heads_per_kv_head_and_nan(cpu_kernels):
    """80 query heads on one KV head (no limit on the group size); a NaN query gives NaN
    for its own request only, as the reference does."""
    torch.manual_seed(0)
    k_buf, v_buf = torch.randn(50, 1, 8), torch.randn(50, 1, 8)
    q = torch.randn(2, 80, 8)
    slots = torch.stack([torch.randperm(50)[:9], torch.randperm(50)[:9]])
    lens = torch.tensor([9, 4])
    want = _dense_decode(q, k_buf, v_buf, slots, lens, 0.3)
    got = cpu_kernels.decode_attention(q, k_buf, v_buf, slots, lens, 0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    q[1, 5, 0] = float("nan")
    got = cpu_kernels.decode_attention(q, k_buf, v_buf, slots, lens, 0.3)
    assert got[1, 5].isnan().all() and not got[0].isnan().any()


def _prefix_sharing_batch(gen: torch.Generator):
    """int64 slots [B, max len] and seq_lens [B] of a batch whose requests share cached
    prefixes in every way the cascade groups (decode_attention.c) must handle, over a pool
    of 8000 slots; slot ids are drawn without repetition except where shared."""
    free = iter(torch.randperm(8000, generator=gen).tolist())
    take = lambda n: [next(free) for _ in range(n)]  # noqa: E731
    a, b = take(200), take(40)
    rows = [
        a + take(60),  # group A: 200 shared keys
        a + take(1),  # its own part is the new key alone
        a + take(90),
        a[:150] + take(30),  # shares 150 with A: A's prefix shrinks to 150
        a[:10] + take(50),  # shares 10 (< CASCADE_MIN): attends alone
        b + take(5),  # group B: 40 shared keys
        b + take(33),
        b[:31] + take(3),  # 31 + 3 keys: too short to join
        take(70),  # its own slots
        take(20),  # a group of one
    ]
    for _ in range(18):  # 18 more pairs: more prefixes than the 16 groups looked for
        c = take(35)
        rows += [c + take(2), c + take(4)]
    lens = torch.tensor([len(r) for r in rows])
    slots = torch.zeros(len(rows), int(lens.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        slots[i, : len(r)] = torch.tensor(r)
    return slots, lens


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim,group", [(64, 3), (128, 2), (24, 5)])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_attention_over_shared_prefixes(cpu_kernels, gemm_isa, kv_dtype, head_dim,
                                               group, threads):  # fmt: skip
    """Requests sharing cached prefixes (the cascade path: shared keys scored once for a
    group, partial softmaxes merged by their maxima) equal the dense reference, as do
    those that attend alone beside them: short shares, groups of one, groups beyond
    the sixteenth, on both instruction sets, fp32 and fp16 pools."""
    gen = torch.Generator().manual_seed(7)
    slots, lens = _prefix_sharing_batch(gen)
    k_buf = torch.randn(8000, 2, head_dim, generator=gen).to(kv_dtype)
    v_buf = torch.randn(8000, 2, head_dim, generator=gen).to(kv_dtype)
    q = torch.randn(len(lens), 2 * group, head_dim, generator=gen)
    want = _dense_decode(q, k_buf.float(), v_buf.float(), slots, lens, 0.2)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_kernels.decode_attention(q, k_buf, v_buf, slots, lens, 0.2)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("members,group,prefix", [(24, 5, 150), (17, 3, 203), (2, 1, 33)])
def test_decode_attention_large_prefix_groups(cpu_kernels, gemm_isa, kv_dtype, members, group,
                                              prefix):  # fmt: skip
    """A group of many members: its members x group query rows span several 16-row vectors
    of the 512-bit shared pass (120 rows: 8 vectors, two of them a tail of the 3-vector
    tiles; 51 rows: a part-filled last vector; 2 rows), over shared chunks whose key counts
    are not multiples of the 4-key tiles (one group's prefix alone is split into chunks of
    128 keys for the threads: 150 and 203 keys take two); equals the dense reference on both
    instruction sets."""
    gen = torch.Generator().manual_seed(members)
    shared = torch.randperm(4000, generator=gen)[:prefix]
    own = 4000 + torch.arange(members * 40).reshape(members, 40)
    lens = prefix + torch.randint(1, 41, (members,), generator=gen)
    slots = torch.cat([shared.expand(members, -1), own], dim=1)
    k_buf = torch.randn(4000 + members * 40, 2, 64, generator=gen).to(kv_dtype)
    v_buf = torch.randn(4000 + members * 40, 2, 64, generator=gen).to(kv_dtype)
    q = torch.randn(members, 2 * group, 64, generator=gen)
    want = _dense_decode(q, k_buf.float(), v_buf.float(), slots, lens, 0.125)
    got = cpu_kernels.decode_attention(q, k_buf, v_buf, slots, lens, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim", [8, 64])
def test_decode_attention_nan_query_in_a_prefix_group(cpu_kernels, head_dim):
    """A NaN query of one member of a prefix group gives NaN for that query head only (head
    dim 64: the 512-bit shared pass, whose vectors hold the group's rows side by side)."""
    gen = torch.Generator().manual_seed(3)
    shared = torch.arange(100)
    slots = torch.stack([torch.cat([shared, 100 + 10 * i + torch.arange(10)]) for i in range(4)])
    lens = torch.full((4,), 110)
    k_buf = torch.randn(200, 1, head_dim, generator=gen)
    v_buf = torch.randn(200, 1, head_dim, generator=gen)
    q = torch.randn(4, 3, head_dim, generator=gen)
    q[2, 1, 0] = float("nan")
    got = cpu_kernels.decode_attention(q, k_buf, v_buf, slots, lens, 0.3)
    want = _dense_decode(q, k_buf, v_buf, slots, lens, 0.3)
    assert got[2, 1].isnan().all()
    torch.testing.assert_close(got[:, 0], want[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[[0, 1, 3]], want[[0, 1, 3]], rtol=1e-5, atol=1e-5)


def _dense_extend(q, k_buf, v_buf, slots, seq_lens, ext_lens, scale):
    """Reference: each new token j of request b (prefix p) attends over b's first p + j + 1
    slots, softmax(scale q K^T) V (GQA by repeat); q, out [T, H, D]."""
    rows = []
    for b, (s, n) in enumerate(zip(seq_lens.tolist(), ext_lens.tolist())):
        for j in range(n):
            rows.append((b, s - n + j + 1))
    out = torch.empty_like(q)
    group = q.shape[1] // k_buf.shape[1]
    for t, (b, length) in enumerate(rows):
        idx = slots[b, :length]
        k = k_buf[idx].float().repeat_interleave(group, dim=1)
        v = v_buf[idx].float().repeat_interleave(group, dim=1)
        p = torch.softmax(scale * torch.einsum("hd,lhd->hl", q[t], k), dim=-1)
        out[t] = torch.einsum("hl,lhd->hd", p, v)
    return out


def _assert_verify_rows(cpu_kernels, gen, slots, seq_lens, ext_lens, kv_dtype, threads):
    """The extend kernel on `threads` threads over random K / V (2 KV heads, 6 query heads,
    head dim 64, a pool of slots.max() + 1 rows in kv_dtype) equals `_dense_extend`."""
    k_buf = torch.randn(int(slots.max()) + 1, 2, 64, generator=gen).to(kv_dtype)
    v_buf = torch.randn(int(slots.max()) + 1, 2, 64, generator=gen).to(kv_dtype)
    q = torch.randn(int(ext_lens.sum()), 6, 64, generator=gen)
    want = _dense_extend(q, k_buf, v_buf, slots, seq_lens, ext_lens, 0.125)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_kernels.extend_attention(q, k_buf, v_buf, slots, seq_lens, ext_lens, 0.125)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "prefix_lens,ext_lens",
    [
        ([400, 410, 420, 430], [4, 4, 4, 4]),  # a verify step: one key chunk per request
        ([900], [5]),  # one request: its keys split into chunks for the threads, merged
        ([0, 2, 700, 31, 64], [3, 16, 7, 1, 2]),  # no prefix, a 16-token tail, a decode
    ],
)
def test_extend_attention_verify_rows(cpu_kernels, gemm_isa, kv_dtype, threads, prefix_lens,
                                      ext_lens):  # fmt: skip
    """Requests of at most 16 new tokens each and no shared keys (a verify step) take the
    verify-row kernel (verify_attention_kv.h): all of a request's rows per KV head and key
    chunk, the causal tail masked; equals the dense reference on both instruction sets,
    fp32 and fp16 pools, one and two threads."""
    gen = torch.Generator().manual_seed(sum(prefix_lens))
    seq_lens = torch.tensor([p + n for p, n in zip(prefix_lens, ext_lens)])
    perm = torch.randperm(6000, generator=gen)
    slots = torch.zeros(len(ext_lens), int(seq_lens.max()), dtype=torch.int64)
    at = 0
    for b, s in enumerate(seq_lens.tolist()):
        slots[b, :s] = perm[at : at + s]
        at += s
    _assert_verify_rows(cpu_kernels, gen, slots, seq_lens, torch.tensor(ext_lens), kv_dtype,
                        threads)  # fmt: skip


def test_extend_attention_verify_rows_of_forked_requests(cpu_kernels, gemm_isa):
    """Verify rows of requests sharing cached keys (forked branches): the shared keys are
    scored once for every row of the group, each request's own keys for its rows (one
    request's 700 own keys in several chunks); a NaN query spoils only its own row and
    head."""
    gen = torch.Generator().manual_seed(5)
    shared = torch.randperm(3000, generator=gen)[:300]
    own = 3000 + torch.arange(4 * 700).reshape(4, 700)
    ext = torch.tensor([3, 5, 1, 4])
    seq_lens = 300 + torch.tensor([12, 700, 7, 15])
    slots = torch.cat([shared.expand(4, -1), own], dim=1)
    k_buf = torch.randn(5800, 1, 64, generator=gen)
    v_buf = torch.randn(5800, 1, 64, generator=gen)
    q = torch.randn(int(ext.sum()), 3, 64, generator=gen)
    q[4, 2, 0] = float("nan")  # request 1's second token, query head 2
    want = _dense_extend(q, k_buf, v_buf, slots, seq_lens, ext, 0.2)
    got = cpu_kernels.extend_attention(q, k_buf, v_buf, slots, seq_lens, ext, 0.2)
    assert got[4, 2].isnan().all() and not got[4, :2].isnan().any()
    keep = torch.ones(int(ext.sum()), dtype=torch.bool)
    keep[4] = False
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[4, :2], want[4, :2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("threads", [1, 2])
def test_extend_attention_verify_rows_over_shared_prefixes(cpu_kernels, gemm_isa, kv_dtype,
                                                           threads):  # fmt: skip
    """Verify rows (1-6 new tokens per request) over the prefix-sharing batch of the decode
    kernel's cascade test: groups whose shared keys span several chunks, own parts of one
    chunk and of several, shares too short to group, groups of one, more prefixes than the
    16 groups looked for; equals the dense causal reference."""
    gen = torch.Generator().manual_seed(11)
    slots, lens = _prefix_sharing_batch(gen)
    ext = torch.randint(1, 7, (len(lens),), generator=gen).minimum(lens)
    _assert_verify_rows(cpu_kernels, gen, slots, lens, ext, kv_dtype, threads)


def test_kernel_entries_reject_bad_tables(cpu_kernels):
    k_buf, v_buf = torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    q, lens = torch.randn(1, 4, 8), torch.tensor([3])
    with pytest.raises(ValueError, match="int64"):
        cpu_kernels.decode_attention(
            q, k_buf, v_buf, torch.zeros(1, 3, dtype=torch.int32), lens, 1.0
        )
    with pytest.raises(ValueError, match="D % 8"):
        cpu_kernels.decode_attention(torch.randn(1, 4, 6), *[torch.randn(20, 2, 6)] * 2,
                              torch.zeros(1, 3, dtype=torch.int64), lens, 1.0)  # fmt: skip
    with pytest.raises(ValueError, match="do not pack"):
        cpu_kernels.mm(torch.randn(2, 8), pack_panels(torch.randn(32, 8)), 40)


def test_row_kernels_reject_mismatched_inputs(cpu_kernels):
    with pytest.raises(ValueError, match="weight must be float32"):
        cpu_kernels.rms_norm(torch.randn(3, 64), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="float32"):
        x = torch.randn(2, 64)
        cpu_kernels.rope_(x, 4, 16, torch.randn(2, 16).double(), torch.randn(2, 16).double())
    half = torch.zeros(10, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unsupported KV buffers"):
        k = torch.ones(2, 2, 16)
        cpu_kernels.store_kv(k, k, half, half, torch.tensor([9, 0]))
    assert not half.any()


def test_cc_with_arguments_and_compiler_errors_are_reported(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", "cc -DRADIXLM_NOT_A_REAL_FLAG_TEST")  # arguments are allowed
    assert cpu_build.compiler() == ["cc", "-DRADIXLM_NOT_A_REAL_FLAG_TEST"]
    fake = tmp_path / "fakecc"
    fake.write_text("#!/bin/sh\necho 'fatal error: omp.h: No such file' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_build, "unsupported_reason", lambda: None)
    with caplog.at_level("INFO", logger="radixlm.kernels.cpu"):
        assert CpuKernels.load.__wrapped__() is None
    assert "omp.h: No such file" in caplog.text
