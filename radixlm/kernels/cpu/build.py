"""Building the CPU kernels: the system C compiler (`$CC`, else cc/gcc) compiles the C
sources once per source version into `$RADIXLM_CACHE_DIR`, keyed by their hash."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from radixlm.config import cache_dir

logger = logging.getLogger(__name__)

_DIR = Path(__file__).parent
SOURCES = [
    _DIR / n
    for n in (
        "packed_gemm.c",
        "quant_gemm.c",
        "quant_int8.c",
        "half_gemm.c",
        "decode_attention.c",
        "decode_attention_mla.c",
        "extend_attention.c",
        "elementwise.c",
        "decode_layer.c",
    )  # fmt: skip
]
HEADERS = [
    _DIR / n
    for n in (
        "simd_math.h",
        "kernels.h",
        "fp8.h",
        "decode_attention_kv.h",
        "verify_attention_kv.h",
        "decode_attention_mla_kv.h",
    )
]
#: -mf16c: the fp16 KV pool conversions (every AVX2 CPU has F16C: Intel from Ivy Bridge,
#: AMD from Piledriver).
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def unsupported_reason() -> str | None:
    """Why the kernels cannot run here (not x86-64, no AVX2/FMA, no compiler), or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not x86-64 ({platform.machine()})"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "the CPU lacks AVX2/FMA"
    if compiler() is None:
        return "no C compiler (set $CC)"
    return None


def compiler() -> list[str] | None:
    """The C compiler command: `$CC` (may carry arguments, e.g. "ccache gcc"), else cc/gcc."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def build() -> Path:
    """Compile the sources unless this version is already in the cache; returns the .so."""
    digest = hashlib.sha256(" ".join(FLAGS).encode())
    for src in SOURCES + HEADERS:
        digest.update(src.read_bytes())
    out = cache_dir() / f"radixlm_cpu-{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        subprocess.run(
            [*compiler(), *FLAGS, *map(str, SOURCES), "-o", str(tmp_so), "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        logger.info("built radixlm's CPU kernels into %s", out)
        os.replace(tmp_so, out)  # atomic: concurrent builders race harmlessly
    return out
