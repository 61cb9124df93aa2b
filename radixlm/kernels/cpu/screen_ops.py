"""The LM head greedy screen's kernels (`half_gemm.c`; used by
`runtime/executor/layers/head_screen.py`): the GEMM of a few rows over fp16 panels, over bfloat16
pair panels with AVX-512 BF16, and the candidate selection. `CpuKernels` inherits them."""

from __future__ import annotations

import ctypes

import torch

from radixlm.kernels.cpu.ffi import bind
from radixlm.kernels.cpu.weights import PANEL


class ScreenKernels:
    """Entry points of `half_gemm.c`, bound by `_bind_screen` from the loaded library."""

    def _bind_screen(self, lib: ctypes.CDLL) -> None:
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        self._hgemm = bind(lib.radixlm_half_gemm, [p, p, p, i64, i64, i64, i32])
        self._bgemm = bind(lib.radixlm_bf16_gemm, [p, p, p, i64, i64, i64, i32], ctypes.c_int)
        self._has_bf16 = bind(lib.radixlm_has_bf16, [], ctypes.c_int)
        screen_args = [p, p, p, p, p, f32, i64, i64, p, i32]
        self._screen = bind(lib.radixlm_screen_select, screen_args, i64)

    def hmm(self, x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
        """x [M, K] float32 times W [n, K] held as float16 panels [ceil(n / 16), K, 16]
        (`pack_panels` of W rounded to float16): returns [M, n] float32, each weight widened
        to fp32 exactly and the products summed in fp32 (in an order of the kernel's own,
        not `mm`'s). Meant for a few rows: each panel is read once per two rows. Raises
        ValueError on a dtype or shape mismatch."""
        if x.dtype != torch.float32 or panels.dtype != torch.float16 or x.dim() != 2:
            raise ValueError(f"hmm takes float32 x [M, K] and float16 panels, got {x.dtype}")
        m, k = x.shape
        if tuple(panels.shape) != (-(-n // PANEL), k, PANEL):
            raise ValueError(f"panels {tuple(panels.shape)} do not pack {n} x {k}")
        x, panels = x.contiguous(), panels.contiguous()
        y = torch.empty(m, n, dtype=torch.float32)
        self._hgemm(x.data_ptr(), panels.data_ptr(), y.data_ptr(), m, k, n, torch.get_num_threads())
        return y

    @property
    def has_bf16(self) -> bool:
        """Whether the CPU has AVX-512 BF16 (`bmm` runs)."""
        return bool(self._has_bf16())

    def bmm(self, x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
        """x bfloat16 [M, 2 K2] times W [n, 2 K2] held as bfloat16 pair panels
        [ceil(n / 16), K2, 16, 2] (`pack_pair_panels`): returns [M, n] float32, each pair of
        products exact and added in fp32 by AVX-512 BF16's `vdpbf16ps` (round to nearest
        even; subnormal inputs and results taken as zero). Raises ValueError on a dtype or
        shape mismatch, RuntimeError where the CPU lacks AVX-512 BF16 (`has_bf16`)."""
        if x.dtype != torch.bfloat16 or panels.dtype != torch.bfloat16 or x.dim() != 2:
            raise ValueError(f"bmm takes bfloat16 x [M, K] and bfloat16 panels, got {x.dtype}")
        m, k = x.shape
        if k % 2 or tuple(panels.shape) != (-(-n // PANEL), k // 2, PANEL, 2):
            raise ValueError(f"panels {tuple(panels.shape)} do not pack {n} x {k} in pairs")
        x, panels = x.contiguous(), panels.contiguous()
        y = torch.empty(m, n, dtype=torch.float32)
        args = (x.data_ptr(), panels.data_ptr(), y.data_ptr(), m, k // 2, n)
        if self._bgemm(*args, torch.get_num_threads()) < 0:
            raise RuntimeError("bmm needs AVX-512 BF16, which this CPU lacks")
        return y

    def screen_select(
        self,
        approx: torch.Tensor,
        c1: torch.Tensor,
        c2: torch.Tensor,
        n1: torch.Tensor,
        n2: torch.Tensor,
        pad: float,
    ) -> torch.Tensor | None:
        """Candidates of the LM head's greedy screen (`head_screen.ArgmaxScreen`): approx
        float32 [M, V] approximate logits (M <= 16, contiguous) whose errors are at most
        n1[b] c1[i] + n2[b] c2[i] + pad (c1, c2 float32 [V], n1, n2 float32 [M]). Row i is
        kept when approx[b, i] + that radius >= max_j (approx[b, j] - its radius) for some
        b. Returns int64 [C] sorted ids, or None when a norm, an approximate logit or a
        floor is not finite. Raises ValueError on a dtype or shape mismatch."""
        m, v = approx.shape
        parts = (approx, c1, c2, n1, n2)
        shapes = ((m, v), (v,), (v,), (m,), (m,))
        if m > 16 or any(t.dtype != torch.float32 or tuple(t.shape) != sh
                         for t, sh in zip(parts, shapes)):  # fmt: skip
            raise ValueError("screen_select takes float32 approx [M <= 16, V], c [V], n [M]")
        parts = [t.contiguous() for t in parts]
        ids = torch.empty(v, dtype=torch.int64)
        threads = torch.get_num_threads()
        count = self._screen(*(t.data_ptr() for t in parts), pad, m, v, ids.data_ptr(), threads)
        return None if count < 0 else ids[:count]
