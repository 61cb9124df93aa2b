"""fp8 KV pools (`--kv-cache-dtype fp8_e4m3` / `fp8_e5m2`): the pool's quantizing store,
the C decode / extend kernels and the Triton kernels (under the interpreter) against
torch_native, which dequantizes the pool and attends."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import ForwardMode, create_attention_backend
from radixlm.kernels.fp8 import FP8_DTYPES, FP8_MAX, KVScales, quantize
from radixlm.runtime.executor.memory import KVPool, LatentKVPool
from tests.kernels.cases import make_case

FORMATS = sorted(FP8_DTYPES)
EXTEND = ([0, 1, 17, 33], [7, 19, 1, 3])
DECODE = ([0, 1, 17, 40, 64], [1, 1, 1, 1, 1])
VERIFY = ([0, 1, 17], [4, 6, 5])
MODES = {
    "extend": (ForwardMode.EXTEND, *EXTEND),
    "decode": (ForwardMode.DECODE, *DECODE),
    "verify": (ForwardMode.TARGET_VERIFY, *VERIFY),
}
#: Scales that are not 1, so a kernel that drops or swaps them fails.
K_SCALE, V_SCALE = 0.5, 2.0


def _fp8_case(fmt: str, mode: str, extra=None, **kw):
    """A random case whose pool holds `fmt` with scales (K_SCALE, V_SCALE) per layer: the
    float buffers quantized (unused NaN slots stay NaN, so stray reads still show)."""
    fmode, prefix_lens, extend_lens = MODES[mode]
    if extra is not None:
        prefix_lens, extend_lens = [*prefix_lens, extra[0]], [*extend_lens, extra[1]]
    case = make_case(fmode, prefix_lens, extend_lens, **kw)
    dtype, pool = FP8_DTYPES[fmt], case.pool
    pool.k_buffer = [quantize(b, K_SCALE, dtype) for b in pool.k_buffer]
    pool.v_buffer = [quantize(b, V_SCALE, dtype) for b in pool.v_buffer]
    pool.dtype = dtype
    n = len(pool.k_buffer)
    pool.use_scales(KVScales((K_SCALE,) * n, (V_SCALE,) * n))
    return case


def _run(name: str, case):
    pool = case.clone_pool()
    backend = create_attention_backend(name, pool, case.scaling)
    backend.init_forward_metadata(case.fb)
    return backend.forward(case.q, case.k, case.v, 0, case.fb), pool, backend


def _bytes(buf: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    return buf[loc].view(torch.uint8)


@pytest.mark.parametrize("fmt", FORMATS)
def test_pool_store_quantizes_with_the_layer_scales(fmt):
    """stored = fp8(clamp(x / scale)), read = stored * scale; values past the format's
    range saturate to +-max * scale instead of becoming inf / NaN."""
    dtype = FP8_DTYPES[fmt]
    pool = KVPool(8, 2, 1, 8, dtype)
    pool.use_scales(KVScales((1.0, 0.25), (1.0, 4.0)))
    k = torch.tensor([[[0.3, -1.7, 5.0, 1e6, -1e6, 0.0, 2.0**-9, 100.0]]])
    loc = torch.tensor([3])
    pool.set_kv(1, loc, k, 2 * k)
    assert torch.equal(
        pool.k_buffer[1][3], (k[0] / 0.25).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    )
    read = pool.v_buffer[1][3].float() * 4.0
    limit = FP8_MAX[dtype] * 4.0
    assert read[0, 3] == limit and read[0, 4] == -limit
    assert torch.isfinite(read).all()
    assert pool.bytes_per_token == 2 * 1 * 8 * 2  # layers * heads * dim * (K, V) * 1 byte
    assert bool((pool.k_buffer[0] == 0).all())  # layer 0 untouched


def test_pool_scales_are_checked():
    pool = KVPool(8, 2, 1, 8, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="2 layers"):
        pool.use_scales(KVScales((1.0,), (1.0,)))
    with pytest.raises(ValueError, match="finite and > 0"):
        KVScales((1.0, 0.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="fp8 pools"):
        KVPool(8, 2, 1, 8, torch.float16).use_scales(KVScales.ones(2))
    latent = LatentKVPool(8, 2, 16, 8, torch.float8_e5m2)
    with pytest.raises(ValueError, match="K and V scales differ"):
        latent.use_scales(KVScales((1.0, 2.0), (1.0, 1.0)))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["extend", "decode", "verify"])
def test_torch_native_attends_over_the_dequantized_pool(fmt, mode):
    """torch_native over an fp8 pool equals torch_native over a float32 pool holding the
    dequantized values (stored * scale) exactly: it is the fp8 kernels' reference."""
    case = _fp8_case(fmt, mode)
    out, pool, _ = _run("torch_native", case)
    ref_case = _fp8_case(fmt, mode)
    p = ref_case.pool
    p.k_buffer = [b.float() * K_SCALE for b in p.k_buffer]
    p.v_buffer = [b.float() * V_SCALE for b in p.v_buffer]
    p.dtype, p.kv_scales = torch.float32, None
    # The new tokens as the fp8 pool will read them back.
    dtype = FP8_DTYPES[fmt]
    ref_case.k = quantize(case.k, K_SCALE, dtype).float() * K_SCALE
    ref_case.v = quantize(case.v, V_SCALE, dtype).float() * V_SCALE
    ref, _, _ = _run("torch_native", ref_case)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    assert pool.k_buffer[0].dtype == dtype


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["extend", "decode"])
@pytest.mark.parametrize("page_size,group,head_dim", [(1, 1, 16), (16, 3, 64), (4, 5, 128)])
@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_kernels_on_fp8_pools_match_torch_native(
    gemm_isa, fmt, mode, page_size, group, head_dim, threads
):
    """The C decode and extend kernels read fp8 K/V exactly (through binary16) and, with
    the K scale folded into the softmax scale and the V scale into the output, equal
    torch_native's dequantize-then-attend; the store is the pool's (same bytes)."""
    from radixlm.kernels.cpu_native import CpuNativeBackend

    extra = (300, 1 if mode == "decode" else 40)
    case = _fp8_case(fmt, mode, extra, page_size=page_size, group=group, head_dim=head_dim)
    ref, ref_pool, _ = _run("torch_native", case)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, pool, backend = _run("cpu", case)
    finally:
        torch.set_num_threads(before)
    if not isinstance(backend, CpuNativeBackend):
        pytest.skip("the CPU kernels cannot be built here")
    assert backend.fused_decode_tables(case.fb) is None  # the fused stack has no fp8 path
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    loc = case.fb.out_cache_loc
    assert torch.equal(_bytes(pool.k_buffer[0], loc), _bytes(ref_pool.k_buffer[0], loc))
    assert torch.equal(_bytes(pool.v_buffer[0], loc), _bytes(ref_pool.v_buffer[0], loc))


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_kernel_reads_every_fp8_code_exactly(cpu_kernels, fmt):
    """All 256 codes (NaN codes aside) through the C decode kernel: one key of value 0
    and one query, so the output is the V row itself, element for element."""
    dtype = FP8_DTYPES[fmt]
    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    finite = torch.isfinite(codes.float())
    values = codes[finite]
    d = values.numel() // 8 * 8
    v_buf = torch.zeros(2, 1, d, dtype=dtype)
    v_buf[1, 0] = values[:d]
    k_buf = torch.zeros(2, 1, d, dtype=dtype)
    q = torch.zeros(1, 1, d)
    out = cpu_kernels.decode_attention(q, k_buf, v_buf, torch.tensor([[1]]), torch.tensor([1]), 1.0)
    assert torch.equal(out[0, 0], values[:d].float())


@pytest.mark.parametrize("fmt", FORMATS)
def test_triton_fp8_round_trip_is_torch_cast(fmt, device):
    """The Triton store's float32 -> fp8 rounding (integer arithmetic on the bits) gives
    torch's bytes on every code's value, the midpoints between neighbours (ties to even),
    points just off them, subnormals, saturation and signed zero; the read gives every
    finite code's value back exactly."""
    from radixlm.kernels.triton.store_kv import store_kv

    dtype = FP8_DTYPES[fmt]
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    vals = codes[torch.isfinite(codes)].sort().values
    mids = (vals[1:] + vals[:-1]) / 2
    off = torch.cat([mids * (1 + 2**-20), mids * (1 - 2**-20)])
    x = torch.cat([vals, mids, off, torch.tensor([0.0, -0.0, 1e-30, -1e-30])])
    x = x[: x.numel() // 8 * 8].reshape(-1, 1, 8)
    n = x.shape[0]
    buf = torch.zeros(n + 1, 1, 8, dtype=dtype, device=device)
    loc = torch.arange(1, n + 1, device=device)
    store_kv(buf, buf.clone(), loc, x.to(device), x.to(device), 1.0, 1.0)
    want = quantize(x, 1.0, dtype)
    assert torch.equal(buf[1:].cpu().view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["extend", "decode", "verify"])
@pytest.mark.parametrize("page_size,group,head_dim", [(1, 1, 16), (4, 3, 24)])
def test_triton_on_fp8_pools_matches_torch_native(fmt, mode, page_size, group, head_dim, device):
    """Triton decode, extend and tree verify over an fp8 pool equal torch_native's
    dequantize-then-attend, and the Triton store writes the pool's bytes."""
    case = _fp8_case(fmt, mode, page_size=page_size, group=group, head_dim=head_dim)
    ref, ref_pool, _ = _run("torch_native", case)
    if device != "cpu":
        case.pool.k_buffer = [b.to(device) for b in case.pool.k_buffer]
        case.pool.v_buffer = [b.to(device) for b in case.pool.v_buffer]
        case.fb = case.fb.to(device)
        case.q, case.k, case.v = case.q.to(device), case.k.to(device), case.v.to(device)
    out, pool, _ = _run("triton", case)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)
    loc = case.fb.out_cache_loc.cpu()
    got_k, got_v = pool.k_buffer[0].cpu(), pool.v_buffer[0].cpu()
    assert torch.equal(_bytes(got_k, loc), _bytes(ref_pool.k_buffer[0], loc))
    assert torch.equal(_bytes(got_v, loc), _bytes(ref_pool.v_buffer[0], loc))


def _latent_fp8_run(name: str, fmt: str, mode: str, device: str):
    """One step of `name` over a `LatentKVPool` in `fmt` (scale K_SCALE for the latent rows,
    which are keys and values alike), filled from a random latent case."""
    from tests.kernels.latent_cases import make_latent_case

    fmode, prefix_lens, extend_lens = MODES[mode]
    rank, rope = 32, 16
    case = make_latent_case(fmode, prefix_lens, extend_lens, heads=16, rank=rank, rope_dim=rope)
    src = case.pool.k_buffer[0]
    pool = LatentKVPool(src.shape[0], 1, rank, rope, FP8_DTYPES[fmt], device)
    pool.k_buffer[0].copy_(quantize(src, K_SCALE, pool.dtype).to(device))
    pool.use_scales(KVScales((K_SCALE,), (K_SCALE,)))
    fb = case.fb.to(device)
    backend = create_attention_backend(name, pool, case.scaling, num_heads=16)
    backend.init_forward_metadata(fb)
    out = backend.forward(case.q.to(device), case.k.to(device), case.v.to(device), 0, fb)
    rows = pool.k_buffer[0][fb.out_cache_loc].cpu().view(torch.uint8)
    return out.cpu(), rows, type(backend).__name__


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["extend", "decode"])
def test_fp8_latent_pools_match_torch_native(fmt, mode, device, cpu_kernels):
    """Multi-head latent attention over an fp8 latent pool: the C MLA decode and extend
    kernels and the Triton MLA decode / extend kernels equal torch_native's
    dequantize-then-attend, and every store writes the same bytes."""
    ref, ref_rows, _ = _latent_fp8_run("torch_native", fmt, mode, "cpu")
    for name, dev in (("cpu", "cpu"), ("triton", device)):
        out, rows, made = _latent_fp8_run(name, fmt, mode, dev)
        assert made == {"cpu": "CpuNativeBackend", "triton": "TritonBackend"}[name]
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        assert torch.equal(rows, ref_rows)
