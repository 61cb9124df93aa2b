"""CPU kernels compiled on first use: the few-row fp32 GEMM over packed weight panels.

`packed_gemm.c` is built with the system C compiler (`$CC`, else `cc`) into
`$RADIXLM_CACHE_DIR` (default `~/.cache/radixlm`), keyed by the source's hash, and loaded
with ctypes. It links the OpenMP runtime torch already loaded (libgomp.so.1), so it
shares torch's threads. Where it cannot be built (no compiler, no AVX2/FMA, not x86),
`PackedGemm.load()` returns None with the reason logged, and callers keep torch's GEMM.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("packed_gemm.c")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
#: Panel width in output columns (two AVX2 registers of fp32).
PANEL = 16


def cache_dir() -> Path:
    """Where compiled kernels are kept: `$RADIXLM_CACHE_DIR` or `~/.cache/radixlm`."""
    return Path(os.environ.get("RADIXLM_CACHE_DIR") or Path.home() / ".cache" / "radixlm")


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """Pack W [N, K] (fp32) into panels [ceil(N / 16), K, 16], zero-padding the last one.

    Panel b holds columns 16b..16b+15 of W^T, so it is one contiguous stream of K * 64
    bytes. Same bytes as W plus the padding.
    """
    n, k = weight.shape
    nb = -(-n // PANEL)
    padded = torch.zeros(nb * PANEL, k, dtype=weight.dtype)
    padded[:n] = weight.detach()
    return padded.view(nb, PANEL, k).transpose(1, 2).contiguous()


class PackedGemm:
    """The compiled kernel: `mm(x, panels, n)` = x @ W^T for W packed by `pack_panels`.

    Use `PackedGemm.load()`; the constructor takes the loaded ctypes library.
    """

    def __init__(self, lib: ctypes.CDLL):
        fn = lib.radixlm_packed_gemm
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._fn = fn

    @classmethod
    def load(cls) -> PackedGemm | None:
        """Build (once per source version) and load the kernel; None where it cannot run
        here (the reason is logged at INFO)."""
        reason = _unsupported_reason()
        if reason is None:
            try:
                return cls(ctypes.CDLL(str(_build())))
            except (OSError, subprocess.CalledProcessError) as exc:
                reason = f"build failed: {exc}"
        logger.info("packed CPU GEMM not used (%s); torch's GEMM serves every row count", reason)
        return None

    def mm(self, x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
        """x [M, K] float32 (made contiguous) times the packed W [n, K]: returns [M, n]
        float32. Raises ValueError on a dtype or K mismatch."""
        if x.dtype != torch.float32 or panels.dtype != torch.float32:
            raise ValueError(f"packed GEMM is fp32 only, got {x.dtype} x {panels.dtype}")
        m, k = x.shape
        if panels.shape[1] != k:
            raise ValueError(f"x has K={k} but the panels hold K={panels.shape[1]}")
        x = x.contiguous()
        y = torch.empty(m, n, dtype=torch.float32)
        self._fn(x.data_ptr(), panels.data_ptr(), y.data_ptr(), m, k, n, torch.get_num_threads())
        return y


def _unsupported_reason() -> str | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not x86-64 ({platform.machine()})"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "the CPU lacks AVX2/FMA"
    if _compiler() is None:
        return "no C compiler (set $CC)"
    return None


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build() -> Path:
    """Compile packed_gemm.c unless this version is already in the cache; returns the .so."""
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(_FLAGS).encode()).hexdigest()[:16]
    out = cache_dir() / f"packed_gemm-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        subprocess.run(
            [_compiler(), *_FLAGS, str(_SOURCE), "-o", str(tmp_so)],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(tmp_so, out)  # atomic: concurrent builders race harmlessly
    return out
