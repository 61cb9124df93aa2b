"""CPU kernels compiled on first use (fp32 compute, AVX2 + FMA + F16C, OpenMP; the KV pool
may be float32 or float16, and fp8 for the attention kernels alone, `KV_DTYPES`):

* `packed_gemm.c`: the GEMM over packed weight panels (`CpuKernels.mm`), AVX-512 where
  the CPU has it, else AVX2 (`CpuKernels.gemm_isa`);
* `quant_gemm.c`: the same GEMM over GGUF Q4_1 / Q8_0 blocks and checkpoint int4-group /
  fp8 panels kept packed (`CpuKernels.qmm`, layouts in `quant.py`), dequantized slice by
  slice into L1 for the same register tiles;
* `quant_int8.c`: the W8A8 int8 GEMM (`CpuKernels.qmm` with `quant.I8`): per-token int8
  activations, int8 dot products (AVX2 maddubs / AVX-512 VNNI), int32 accumulation;
* `half_gemm.c`: the LM head's greedy screen: the GEMM of a few rows over IEEE fp16 panels
  (`CpuKernels.hmm`) or, with AVX-512 BF16, over bfloat16 pair panels (`CpuKernels.bmm`),
  and the candidate selection (`CpuKernels.screen_select`);
* `decode_attention.c`: paged decode attention read in place from the KV pool
  (`CpuKernels.decode_attention`; `decode_attention_kv.h` is its body, once per KV dtype),
  in 512-bit vectors where `gemm_isa` is "avx512" and head_dim % 64 == 0; requests that
  share a cached prefix attend over it together (cascade attention);
* `decode_attention_mla.c`: decode attention whose V rows are narrower than K or a view of
  them (multi-head latent attention's latent pool, docs/kernels.md): each K row read once
  for all the query heads of its KV head, keys split across threads when requests are few
  (`decode_attention_mla_kv.h` is its body, once per KV dtype);
* `extend_attention.c`: paged causal prefill attention, FlashAttention-style blocks
  (`CpuKernels.extend_attention`), K and V rows of their own widths and strides;
* `elementwise.c`: RMSNorm, silu(gate) * up, RoPE in place, and the KV-pool store;
* `decode_layer.c`: all the Llama decoder layers of a decode step (or a short causal
  extend) in one call.

The sources are built with the system C compiler (`$CC`, else `cc`) into one library in
`$RADIXLM_CACHE_DIR` (default `~/.cache/radixlm`), keyed by the sources' hash, and
loaded with ctypes. It links the OpenMP runtime torch already loaded (libgomp.so.1), so
it shares torch's threads. Where it cannot be built (no compiler, no AVX2/FMA, not x86),
`CpuKernels.load()` returns None with the reason logged, and callers keep torch's ops.
Building lives in `build.py`, the packed weight layouts in `weights.py` and `quant.py`,
the head screen's entry points in `screen_ops.py`, the attention ones in `attention_ops.py`.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
from functools import cache

import torch

from radixlm.kernels.cpu import build, quant
from radixlm.kernels.cpu.attention_ops import (
    KV_DTYPES,
    AttentionKernels,
    _check_extend,
    _check_pool,
    _check_rows,
    _check_tables,
)
from radixlm.kernels.cpu.ffi import bind as _bind
from radixlm.kernels.cpu.screen_ops import ScreenKernels
from radixlm.kernels.cpu.weights import (
    HUGE_PAGE,
    PANEL,
    empty_in_huge_pages,
    into_huge_pages,
    pack_pair_panels,
    pack_panels,
)

logger = logging.getLogger(__name__)

__all__ = [
    "HUGE_PAGE", "KV_DTYPES", "PANEL", "CpuKernels", "LayerSpec", "empty_in_huge_pages",
    "into_huge_pages", "pack_pair_panels", "pack_panels",
]  # fmt: skip

#: KV pool dtypes the attention and KV-store kernels read and write (computing in fp32).


class LayerSpec(ctypes.Structure):
    """`radixlm_layer` of decode_layer.c: one decoder layer's weights (pointers into tensors
    the caller keeps alive) and sizes."""

    _fields_ = [
        *(
            (name, ctypes.c_void_p)
            for name in ("ln1", "ln2", "qkv", "qkv_bias", "o", "gate_up", "down")
        ),
        *((name, ctypes.c_int64) for name in ("hidden", "inter", "heads", "kv_heads", "head_dim")),
        # Each projection's panel format: quant.FP32, Q4_1 or Q8_0.
        *((name, ctypes.c_int64) for name in ("qkv_fmt", "o_fmt", "gate_up_fmt", "down_fmt")),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
    ]


class CpuKernels(ScreenKernels, AttentionKernels):
    """The compiled kernels. Use `CpuKernels.load()` (built and loaded once per process);
    the constructor takes the loaded ctypes library. The LM head screen's entry points
    (`hmm`, `bmm`, `has_bf16`, `screen_select`) come from `ScreenKernels`, the attention
    ones (`extend_attention`, `decode_attention`, `store_kv`) from `AttentionKernels`."""

    def __init__(self, lib: ctypes.CDLL):
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        self._gemm = _bind(lib.radixlm_packed_gemm, [p, p, p, i64, i64, i64, i32])
        self._gemm_isa = _bind(lib.radixlm_gemm_isa, [i32], ctypes.c_int)
        self._qgemm = _bind(lib.radixlm_quant_gemm, [p, i64, p, i32, p, i64, i64, i64, i32])
        self._dequant = _bind(lib.radixlm_quant_dequant, [i32, p, i64, p])
        self._i8gemm = _bind(lib.radixlm_int8_gemm, [p, i64, p, p, i64, i64, i64, i32])
        self._bind_screen(lib)
        self._bind_attention(lib)
        self._norm = _bind(lib.radixlm_rms_norm, [p, i64, p, p, i64, i64, f32, i32])
        self._silu_mul = _bind(lib.radixlm_silu_mul, [p, p, i64, i64, i32])
        self._rope = _bind(lib.radixlm_rope, [p, i64, i64, i64, i64, p, p, i32])
        # specs, n, k_bufs, v_bufs, kv_f16, x, T, cos, sin, loc, slots, ld_slots, seq_lens,
        # B, ext_lens, scratch, threads
        layers_args = [ctypes.POINTER(LayerSpec), i64, p, p, i32, p, i64, p, p, p, p, i64, p]
        layers_args += [i64, p, p, i32]
        self._layers = _bind(lib.radixlm_decode_layers, layers_args, ctypes.c_int)

    @staticmethod
    @cache
    def load() -> CpuKernels | None:
        """Build (once per source version) and load the kernels; None where they cannot
        run here (the reason is logged at INFO)."""
        reason = build.unsupported_reason()
        if reason is None:
            try:
                kernels = CpuKernels(ctypes.CDLL(str(build.build())))
                logger.info("radixlm's CPU kernels loaded (packed GEMM, attention, fused layer)")
                return kernels
            except subprocess.CalledProcessError as exc:
                reason = f"build failed: {exc}; compiler said: {(exc.stderr or '').strip()[-2000:]}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                reason = f"build failed: {exc}"
        logger.info("radixlm's CPU kernels not used (%s); torch's ops serve instead", reason)
        return None

    def mm(self, x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
        """x [M, K] float32 (made contiguous) times the packed W [n, K]: returns [M, n]
        float32. Raises ValueError on a dtype or K mismatch."""
        if x.dtype != torch.float32 or panels.dtype != torch.float32:
            raise ValueError(f"packed GEMM is fp32 only, got {x.dtype} x {panels.dtype}")
        m, k = x.shape
        if panels.shape[1] != k:
            raise ValueError(f"x has K={k} but the panels hold K={panels.shape[1]}")
        if panels.shape[0] != -(-n // PANEL) or panels.shape[2] != PANEL:
            raise ValueError(f"panels {tuple(panels.shape)} do not pack {n} outputs")
        panels = panels.contiguous()
        x = x.contiguous()
        y = torch.empty(m, n, dtype=torch.float32)
        self._gemm(x.data_ptr(), panels.data_ptr(), y.data_ptr(), m, k, n, torch.get_num_threads())
        return y

    def qmm(self, x: torch.Tensor, panels: torch.Tensor, fmt: int, n: int) -> torch.Tensor:
        """x [M, K] float32 (rows may be strided) times W [n, K] held as quantized panels
        uint8 [n / 16, K / 32, group bytes] of format `fmt` (`quant.Q4_1`, `Q8_0`, `W4G`,
        `F8`): returns [M, n] float32, equal bit for bit to `mm` over fp32 panels of the
        dequantized W; or, for `quant.I8`, the W8A8 int8 product of x and the flat buffer
        `panels` (`quant.pack_int8`), bit for bit `quant_ref.w8a8_int8_ref`. Raises
        ValueError on a dtype, format or shape mismatch."""
        if x.dtype != torch.float32 or panels.dtype != torch.uint8 or x.dim() != 2:
            raise ValueError(f"qmm takes float32 x [M, K] and uint8 panels, got {x.dtype}")
        m, k = x.shape
        if fmt == quant.I8:
            return self._int8_mm(x, panels, n)
        group = quant.GROUP_BYTES.get(fmt)
        if group is None or tuple(panels.shape) != (n // 16, k // 32, group) or n % 16 or k % 32:
            raise ValueError(f"panels {tuple(panels.shape)} of format {fmt} do not hold {n} x {k}")
        # Rows may stay strided below quant_gemm.c's QBLOCKED_ROWS (24); the blocked path
        # reads x contiguous.
        if x.stride(1) != 1 or m >= 24:
            x = x.contiguous()
        panels = panels.contiguous()
        y = torch.empty(m, n, dtype=torch.float32)
        self._qgemm(
            x.data_ptr(), x.stride(0), panels.data_ptr(), fmt, y.data_ptr(), m, k, n,
            torch.get_num_threads(),
        )  # fmt: skip
        return y

    def _int8_mm(self, x: torch.Tensor, buf: torch.Tensor, n: int) -> torch.Tensor:
        m, k = x.shape
        if buf.dim() != 1 or buf.numel() != quant.I8_HEADER + n * (4 + k) or n % 16 or k % 32:
            raise ValueError(f"int8 buffer of {buf.numel()} bytes does not hold {n} x {k}")
        if x.stride(1) != 1:
            x = x.contiguous()
        buf = buf.contiguous()
        y = torch.empty(m, n, dtype=torch.float32)
        self._i8gemm(
            x.data_ptr(), x.stride(0), buf.data_ptr(), y.data_ptr(), m, k, n,
            torch.get_num_threads(),
        )  # fmt: skip
        return y

    def dequantize(self, panels: torch.Tensor, fmt: int) -> torch.Tensor:
        """The C kernels' dequantization of one panel's groups: panels uint8 [G, group
        bytes] (one panel's K / 32 groups) -> float32 [G * 32, 16] (k rows, 16 columns)."""
        group = quant.GROUP_BYTES.get(fmt)
        if panels.dtype != torch.uint8 or panels.dim() != 2 or panels.shape[1] != group:
            raise ValueError(f"dequantize takes uint8 [G, {group}] groups of format {fmt}")
        panels = panels.contiguous()
        out = torch.empty(panels.shape[0] * 32, 16, dtype=torch.float32)
        self._dequant(fmt, panels.data_ptr(), panels.shape[0], out.data_ptr())
        return out

    def gemm_isa(self, use_avx512: bool | None = None) -> str:
        """The instruction set `mm`, the fused layers' GEMMs and the attention kernels' wide
        paths run: "avx512" or "avx2". The default is AVX-512 where the CPU has AVX-512F;
        `use_avx512` True/False switches it for the whole process (True is ignored without
        AVX-512F); None only asks."""
        request = -1 if use_avx512 is None else int(use_avx512)
        return "avx512" if self._gemm_isa(request) else "avx2"

    def decode_layers(
        self,
        specs: ctypes.Array,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_bufs: list[torch.Tensor],
        v_bufs: list[torch.Tensor],
        loc: torch.Tensor,
        slots: torch.Tensor,
        seq_lens: torch.Tensor,
        ext_lens: torch.Tensor | None = None,
    ) -> None:
        """Run the decoder layers `specs` (a ctypes array of `LayerSpec`, one size for all)
        in place on x float32 [T, hidden] contiguous; layer i uses k_bufs[i] / v_bufs[i].
        Each layer: RMSNorm, q/k/v, RoPE (cos, sin float32 [T, head_dim]), KV store at
        `loc` (int64 [T]), attention over `slots` / `seq_lens` (int64 [B, >= max len] /
        [B]), output projection, residual, RMSNorm, SwiGLU MLP, residual.

        ext_lens None: a decode step, one new token per request (T == B, as
        `decode_attention`). ext_lens int64 [B]: a causal extend of ext_lens[b] new tokens
        per request, in request order (as `extend_attention`; head_dim % 16 == 0).
        Raises ValueError on a non-contiguous x or mismatched buffers or lengths,
        MemoryError as the attention kernels."""
        t, n, spec = x.shape[0], len(specs), specs[0]
        if not x.is_contiguous() or x.dtype != torch.float32 or x.shape[1] != spec.hidden:
            raise ValueError(f"decode_layers: x must be contiguous float32 [T, {spec.hidden}]")
        if len(k_bufs) != n or len(v_bufs) != n:
            raise ValueError(f"decode_layers: {n} layers but {len(k_bufs)} / {len(v_bufs)} buffers")
        f16 = {_check_pool(k, v, spec.heads, spec.head_dim) for k, v in zip(k_bufs, v_bufs)}
        if len(f16) != 1 or not f16 <= {0, 1}:
            raise ValueError("decode_layers: the KV buffers must be all float32 or all float16")
        b = seq_lens.shape[0] if ext_lens is not None else t
        _check_tables(b, slots, seq_lens)
        if ext_lens is not None:
            _check_extend(ext_lens, seq_lens, t, spec.head_dim)
            ext_lens = ext_lens.contiguous()
        if loc.dtype != torch.int64 or loc.shape != (t,):
            raise ValueError("decode_layers: loc must be int64 [T]")
        qkv = (spec.heads + 2 * spec.kv_heads) * spec.head_dim
        hd = spec.heads * spec.head_dim
        floats = t * (2 * spec.hidden + qkv + hd + 3 * spec.inter)  # decode_layer.c's layout
        scratch = torch.empty(floats, dtype=torch.float32)
        cos = cos.reshape(t, spec.head_dim).float().contiguous()
        sin = sin.reshape(t, spec.head_dim).float().contiguous()
        loc, slots, seq_lens = loc.contiguous(), slots.contiguous(), seq_lens.contiguous()
        k_ptrs = (ctypes.c_void_p * n)(*(buf.data_ptr() for buf in k_bufs))
        v_ptrs = (ctypes.c_void_p * n)(*(buf.data_ptr() for buf in v_bufs))
        rc = self._layers(
            specs, n, k_ptrs, v_ptrs, f16.pop(), x.data_ptr(), t, cos.data_ptr(), sin.data_ptr(),
            loc.data_ptr(), slots.data_ptr(), slots.shape[1], seq_lens.data_ptr(), b,
            None if ext_lens is None else ext_lens.data_ptr(), scratch.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("CPU attention could not allocate its buffers")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * x / sqrt(mean(x^2) + eps) per row: x float32 [rows, dim] (rows may be
        strided), weight float32 [dim]. Returns a new contiguous [rows, dim]."""
        _check_rows("rms_norm", x)
        rows, dim = x.shape
        if weight.dtype != torch.float32 or weight.shape != (dim,):
            raise ValueError(f"rms_norm: weight must be float32 [{dim}]")
        y = torch.empty(rows, dim, dtype=torch.float32)
        w = weight.contiguous()
        self._norm(
            x.data_ptr(),
            x.stride(0),
            w.data_ptr(),
            y.data_ptr(),
            rows,
            dim,
            eps,
            torch.get_num_threads(),
        )
        return y

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up float32 [rows, 2n] contiguous (gate first, then up).
        Returns [rows, n]."""
        _check_rows("silu_mul", gate_up)
        gate_up = gate_up.contiguous()
        rows, n2 = gate_up.shape
        y = torch.empty(rows, n2 // 2, dtype=torch.float32)
        self._silu_mul(gate_up.data_ptr(), y.data_ptr(), rows, n2 // 2, torch.get_num_threads())
        return y

    def rope_(
        self, x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> None:
        """Rotate, in place, the first `heads` heads of each row of x float32 [rows, >=
        heads * head_dim] (rows may be strided) by cos, sin float32 [rows, head_dim]
        (rotate-half layout, as `models.llama.apply_rotary`)."""
        _check_rows("rope", x)
        if x.shape[1] < heads * head_dim or head_dim % 2:
            raise ValueError(
                f"rope: rows of {x.shape[1]} floats cannot hold {heads} heads "
                f"of an even head_dim {head_dim}"
            )
        if cos.dtype != torch.float32 or sin.dtype != torch.float32:
            raise ValueError("rope: cos and sin must be float32")
        cos, sin = cos.reshape(-1, head_dim).contiguous(), sin.reshape(-1, head_dim).contiguous()
        if cos.shape[0] != x.shape[0] or sin.shape != cos.shape:
            raise ValueError("rope: cos and sin need one row per row of x")
        self._rope(
            x.data_ptr(),
            x.stride(0),
            x.shape[0],
            heads,
            head_dim,
            cos.data_ptr(),
            sin.data_ptr(),
            torch.get_num_threads(),
        )
