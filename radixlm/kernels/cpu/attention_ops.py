"""The paged attention kernels (`decode_attention.c`, `decode_attention_mla.c`,
`extend_attention.c`) and the KV store, with the checks of their inputs. `CpuKernels`
inherits them.

The KV pool's buffers may be float32, float16, or fp8 e4m3fn / e5m2 (`KV_DTYPES`; fp8
read exactly through binary16, `fp8.h`); the kernels compute in fp32. They apply no fp8
scale: the caller folds a K scale into `scale` and multiplies the output by the V scale
(`radixlm.kernels.fp8`). The store takes float32 and float16 pools only.
V rows may be narrower than K rows and lie at their own stride, as a view of K's first
Dv elements (multi-head latent attention's pool, docs/kernels.md).
"""

from __future__ import annotations

import ctypes

import torch

from radixlm.kernels.cpu.ffi import bind

#: KV pool dtypes the attention kernels read, in the order of their kv_fmt codes (fp8.h).
KV_DTYPES = (torch.float32, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)
#: KV pool dtypes `store_kv` writes.
STORE_DTYPES = (torch.float32, torch.float16)


class AttentionKernels:
    """Entry points of the attention kernels, bound by `_bind_attention` from the loaded
    library."""

    def _bind_attention(self, lib: ctypes.CDLL) -> None:
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        attn_args = [p, i64, p, p, i32, p, i64, p, p, i64, i64, i64, i64, f32, i64, i32]
        self._attn = bind(lib.radixlm_decode_attention, attn_args, ctypes.c_int)
        # q, ldq, k, ldk, v, ldv, fmt, slots, ld_slots, seq_lens, [ext_lens,] out, B, H, Hkv,
        # Dk, Dv, scale, window, threads
        mla_args = [p, i64, p, i64, p, i64, i32, p, i64, p, p, i64, i64, i64, i64, i64, f32]
        mla_args += [i64, i32]
        self._mla_attn = bind(lib.radixlm_decode_attention_mla, mla_args, ctypes.c_int)
        ext_args = mla_args[:10] + [p] + mla_args[10:]
        self._ext_attn = bind(lib.radixlm_extend_attention, ext_args, ctypes.c_int)
        self._store_kv = bind(lib.radixlm_store_kv, [p, p, i64, p, p, i32, p, i64, i64, i32])

    def extend_attention(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        slots: torch.Tensor,
        seq_lens: torch.Tensor,
        ext_lens: torch.Tensor,
        scale: float,
        window: int = 0,
    ) -> torch.Tensor:
        """Causal softmax(scale * q K^T) V of every new token of an extend step.

        Args:
            q: float32 [T, H, Dk], T = ext_lens.sum(), each request's new tokens in order;
                token rows may be strided (else it is copied); Dk a multiple of 16.
            k_buf: a `KV_DTYPES` dtype, [num_slots, Hkv, Dk] contiguous, v_buf [num_slots,
                Hkv, Dv] of the same dtype, Dv a multiple of 16, heads contiguous within a
                slot, slots at any stride (a view of k_buf[:, :, :Dv] included): one layer
                of the KV pool, the new tokens' K/V already stored; H a multiple of Hkv.
            slots: int64 [B, >= max(seq_lens)]; row b's first seq_lens[b] entries are the
                request's KV slots in order (cached prefix, then the new tokens).
            seq_lens: int64 [B]; ext_lens: int64 [B], 1 <= ext_lens[b] <= seq_lens[b].
            window: sliding window, 0 for none.
        Returns:
            float32 [T, H, Dv]: new token j of request b (position i = seq_lens[b] -
            ext_lens[b] + j) attends over keys 0..i, or max(0, i - window + 1)..i with a
            window > 0. Raises ValueError on
            shapes or dtypes outside the above, MemoryError when the kernel cannot
            allocate its buffers.
        """
        t, h, d = q.shape
        dv = v_buf.shape[-1]
        if d % 16 or dv % 16:
            raise ValueError(f"CPU extend attention needs D % 16 == 0, got Dk={d}, Dv={dv}")
        b = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
        q, slots, seq_lens, (fmt, ldk, ldv) = _attention_inputs(q, k_buf, v_buf, b, slots, seq_lens)
        _check_extend(ext_lens, seq_lens, t, d)
        _check_window(window)
        ext_lens = ext_lens.contiguous()
        out = torch.empty(t, h, dv, dtype=torch.float32)
        rc = self._ext_attn(
            q.data_ptr(), q.stride(0), k_buf.data_ptr(), ldk, v_buf.data_ptr(), ldv, fmt,
            slots.data_ptr(), slots.shape[1], seq_lens.data_ptr(), ext_lens.data_ptr(),
            out.data_ptr(), b, h, k_buf.shape[1], d, dv, scale, window, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("CPU extend attention could not allocate its buffers")
        return out

    def decode_attention(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        slots: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int = 0,
    ) -> torch.Tensor:
        """Softmax(scale * q K^T) V of one new token per request over its sequence (with a
        sliding window > 0: over its last `window` keys; 0 for none).

        Args:
            q: float32 [B, H, Dk], rows may be strided (else it is copied); Dk a multiple
                of 8.
            k_buf: a `KV_DTYPES` dtype, [num_slots, Hkv, Dk] contiguous, one layer of the KV
                pool; H a multiple of Hkv. v_buf: the same dtype, [num_slots, Hkv, Dv]
                contiguous with Dv == Dk (the plain kernel, `decode_attention.c`), or any
                Dv multiple of 8 with heads contiguous within a slot and slots at any
                stride, e.g. the view k_buf[:, :, :Dv] of a latent pool
                (`decode_attention_mla.c`: every K row read once for all H / Hkv query
                heads, V from the same rows while they are cached, keys split across
                threads when requests are few).
            slots: int64 [B, >= max(seq_lens)] contiguous; row b's first seq_lens[b]
                entries are the request's KV slots in order.
            seq_lens: int64 [B], each >= 1.
        Returns:
            float32 [B, H, Dv]. Raises ValueError on shapes or dtypes outside the above,
            MemoryError when the per-thread buffers cannot be allocated.

        Requests whose slot lists start with the same >= 32 slots (a prefix the radix
        cache shares) read those keys once for all of them: cascade attention, the
        partial softmaxes merged by their maxima (Hydragen, Juravsky et al. 2024). The
        result equals the per-request one up to float rounding. (Not under a window, where
        each request's keys start at its own place.)
        """
        b, h, d = q.shape
        hkv = k_buf.shape[1]
        q, slots, seq_lens, (fmt, ldk, ldv) = _attention_inputs(q, k_buf, v_buf, b, slots, seq_lens)
        _check_window(window)
        dv = v_buf.shape[2]
        if dv != d or ldv != ldk:
            out = torch.empty(b, h, dv, dtype=torch.float32)
            rc = self._mla_attn(
                q.data_ptr(), q.stride(0), k_buf.data_ptr(), ldk, v_buf.data_ptr(), ldv, fmt,
                slots.data_ptr(), slots.shape[1], seq_lens.data_ptr(), out.data_ptr(), b, h,
                hkv, d, dv, scale, window, torch.get_num_threads(),
            )  # fmt: skip
            if rc != 0:
                raise MemoryError("CPU decode attention could not allocate its buffers")
            return out
        out = torch.empty(b, h, d, dtype=torch.float32)
        rc = self._attn(
            q.data_ptr(),
            q.stride(0),
            k_buf.data_ptr(),
            v_buf.data_ptr(),
            fmt,
            slots.data_ptr(),
            slots.shape[1],
            seq_lens.data_ptr(),
            out.data_ptr(),
            b,
            h,
            hkv,
            d,
            scale,
            window,
            torch.get_num_threads(),
        )
        if rc != 0:
            raise MemoryError("CPU decode attention could not allocate its score buffers")
        return out

    def store_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
    ) -> None:
        """k_buf[loc] = k, v_buf[loc] = v: k, v float32 [T, Hkv, D] with contiguous
        [Hkv, D] rows and one row stride between them; buffers float32 or float16 [slots,
        Hkv, D] contiguous (float16: rounded to nearest even); loc int64 [T] (not checked
        against the buffer size: the allocator owns the slots)."""
        t = k.shape[0]
        width = k.shape[1] * k.shape[2]
        f16 = _check_pool(k_buf, v_buf, k.shape[1], k.shape[2])
        if k_buf.dtype not in STORE_DTYPES:
            raise ValueError(f"store_kv writes float32 or float16 pools, not {k_buf.dtype}")
        if k_buf.shape[1:] != k.shape[1:] or v.shape != k.shape:
            raise ValueError("store_kv: k, v and the buffers need the same [Hkv, D]")
        k2, v2 = k.reshape(t, width), v.reshape(t, width)
        _check_rows("store_kv", k2, v2)
        if k2.stride(0) != v2.stride(0) or loc.dtype != torch.int64 or loc.shape != (t,):
            raise ValueError("store_kv: k and v need one row stride and loc int64 [T]")
        loc = loc.contiguous()
        self._store_kv(
            k2.data_ptr(),
            v2.data_ptr(),
            k2.stride(0),
            k_buf.data_ptr(),
            v_buf.data_ptr(),
            f16,
            loc.data_ptr(),
            t,
            width,
            torch.get_num_threads(),
        )


def _attention_inputs(q, k_buf, v_buf, b, slots, seq_lens):
    """Checks an attention call's q (float32 [rows, H, Dk]), pool buffers and tables for B =
    `b` requests (ValueError); returns (q, slots, seq_lens, (kv_fmt, ldk, ldv)) ready for C
    (`_kv_layout`): token rows may stay strided (q inside a fused qkv row), heads and dims
    made contiguous."""
    layout = _kv_layout(k_buf, v_buf, q.shape[1], q.shape[2])
    if q.dtype != torch.float32:
        raise ValueError(f"CPU attention is fp32 only, got {q.dtype}")
    _check_tables(b, slots, seq_lens)
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        q = q.contiguous()
    return q, slots.contiguous(), seq_lens.contiguous(), layout


def _kv_layout(k_buf: torch.Tensor, v_buf: torch.Tensor, heads: int, head_dim: int):
    """One layer's K/V buffers for the attention kernels: K as `_check_pool`; V of K's dtype
    and device, [slots, Hkv, Dv] with Dv % 8 == 0 and each slot's Hkv * Dv elements
    contiguous, slots at any stride (a latent pool's view k_buf[:, :, :Dv]). Returns (kv_fmt,
    ldk, ldv): the kernels' format code and the K and V slot strides in elements."""
    if v_buf.shape == k_buf.shape and v_buf.is_contiguous():
        fmt = _check_pool(k_buf, v_buf, heads, head_dim)
        return fmt, v_buf.stride(0), v_buf.stride(0)
    fmt = _check_pool(k_buf, k_buf, heads, head_dim)
    hkv, dv = k_buf.shape[1], v_buf.shape[-1]
    ok = (
        v_buf.dtype == k_buf.dtype
        and v_buf.device == k_buf.device
        and v_buf.dim() == 3
        and v_buf.shape[:2] == k_buf.shape[:2]
        and dv % 8 == 0
        and v_buf.stride(2) == 1
        and (hkv == 1 or v_buf.stride(1) == dv)
    )
    if not ok:
        raise ValueError(
            f"unsupported V buffer {v_buf.dtype} {tuple(v_buf.shape)} strides {v_buf.stride()} "
            f"for K {k_buf.dtype} {tuple(k_buf.shape)} (need [slots, Hkv, Dv] of K's dtype, "
            "Dv % 8 == 0, each slot's heads contiguous)"
        )
    return fmt, k_buf.stride(0), v_buf.stride(0)


def _check_pool(k_buf: torch.Tensor, v_buf: torch.Tensor, heads: int, head_dim: int) -> int:
    """One layer's K/V buffers: one `KV_DTYPES` dtype, [slots, Hkv, D] contiguous on the
    CPU, D % 8 == 0, `heads` a multiple of Hkv. Returns the kernels' kv_fmt code (the
    dtype's index in `KV_DTYPES`: 0 float32, 1 float16, 2 e4m3fn, 3 e5m2)."""
    ok = (
        k_buf.dtype == v_buf.dtype
        and k_buf.dtype in KV_DTYPES
        and k_buf.device.type == v_buf.device.type == "cpu"
        and k_buf.is_contiguous()
        and v_buf.is_contiguous()
        and k_buf.dim() == 3
        and v_buf.shape == k_buf.shape
        and k_buf.shape[2] == head_dim
        and head_dim % 8 == 0
        and heads % k_buf.shape[1] == 0
    )
    if not ok:
        raise ValueError(
            f"unsupported KV buffers {k_buf.dtype} {tuple(k_buf.shape)} for {heads} heads of "
            f"{head_dim} (need float32, float16 or fp8 [slots, Hkv, D] contiguous, D % 8 == 0, "
            "Hkv | heads)"
        )
    return KV_DTYPES.index(k_buf.dtype)


def _check_tables(b: int, slots: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """slots int64 [B, L], seq_lens int64 [B]. That every length is in [1, L] is the
    caller's invariant (not checked here: it would cost two reductions per layer call)."""
    if slots.dtype != torch.int64 or seq_lens.dtype != torch.int64:
        raise ValueError("slots and seq_lens must be int64")
    if slots.dim() != 2 or slots.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError("slots and seq_lens need one row per request")


def _check_extend(ext_lens: torch.Tensor, seq_lens: torch.Tensor, t: int, head_dim: int) -> None:
    """ext_lens int64 [B], each in [1, seq_lens[b]], summing to the t new tokens; the
    extend kernel needs head_dim % 16 == 0."""
    if head_dim % 16:
        raise ValueError(f"CPU extend attention needs D % 16 == 0, got D={head_dim}")
    if ext_lens.dtype != torch.int64 or ext_lens.shape != seq_lens.shape:
        raise ValueError("ext_lens must be int64 [B]")
    if int(ext_lens.sum()) != t or bool(((ext_lens < 1) | (ext_lens > seq_lens)).any()):
        raise ValueError("ext_lens must be in [1, seq_lens] and sum to the new token count")


def _check_window(window: int) -> None:
    """A sliding window is an int >= 0 (0: none)."""
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (0: none), got {window!r}")


def _check_rows(name: str, *tensors: torch.Tensor) -> None:
    """fp32, 2-D, unit stride along the last dimension (rows may be strided)."""
    for t in tensors:
        if t.dtype != torch.float32 or t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(
                f"{name}: expected 2-D float32 rows with unit inner stride, "
                f"got {t.dtype} {tuple(t.shape)} strides {t.stride()}"
            )
