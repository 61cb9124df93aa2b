"""Element sizes of the number formats the planner prices.

Sizes are storage bytes per element. ``int4`` is 0.5 byte per weight; weight-only int4
formats (GPTQ, AWQ) add one fp16 scale and one fp16 zero point per group of weights,
which `weight_bytes_per_param` includes (group size 128 by default: 4 bytes / 128 =
0.03125 byte per weight). Per-channel or per-tensor scales of fp8 / int8 are a few bytes
per row and are ignored. KV-cache quantization scales are ignored likewise.

``q4_1`` and ``q8_0`` are llama.cpp's GGUF block formats (ggml-quants): each block of 32
weights of a row stores an fp16 scale d (and for Q4_1 an fp16 minimum m) beside its 4-bit
or 8-bit codes, so Q4_1 is 16 + 4 = 20 bytes per 32 weights (0.625 byte each) and Q8_0
32 + 2 = 34 bytes per 32 (1.0625). Their scales are part of the element size. radixlm's CPU
kernels keep such blocks packed and compute in fp32 (`kernels/cpu/quant_gemm.c`,
``--weight-format gguf``).
"""

from __future__ import annotations

from radixlm.plan.validate import POSITIVE_INT

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "q8_0": 34 / 32,
    "q4_1": 20 / 32,
}

KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
WEIGHT_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "q8_0", "q4_1")
#: GGUF block formats: computed in fp32 after dequantization (see module doc).
GGUF_DTYPES = ("q8_0", "q4_1")

_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "q8-0": "q8_0",
    "q4-1": "q4_1",
}


def normalize(dtype: str) -> str:
    """Canonical dtype name (``bfloat16`` -> ``bf16``); raises ValueError if unknown."""
    name = _ALIASES.get(dtype.lower(), dtype.lower())
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPE_BYTES)}")
    return name


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[normalize(dtype)]


def weight_bytes_per_param(dtype: str, group_size: int = 128) -> float:
    """Bytes per quantized weight including group scales (int4 only, see module doc)."""
    name = normalize(dtype)
    POSITIVE_INT.check("group_size", group_size)
    if name == "int4":
        return 0.5 + 4.0 / group_size
    return DTYPE_BYTES[name]


#: Weight formats that do not run bf16 matmuls (see `compute_precision`).
_PRECISION = {"fp8": "fp8", "int8": "int8", "fp32": "fp32", **dict.fromkeys(GGUF_DTYPES, "fp32")}


def compute_precision(weight_dtype: str) -> str:
    """The tensor-core precision a weight format runs at.

    fp8 weights run fp8 matmuls (W8A8-FP8), int8 weights int8 matmuls (W8A8), fp32 runs
    as fp32 (TF32 on GPUs), GGUF blocks (q8_0, q4_1) as fp32 (radixlm dequantizes them
    into fp32 tiles), and everything else (bf16, fp16, int4 weight-only, which
    dequantizes to 16 bits in the kernel) runs bf16.
    """
    return _PRECISION.get(normalize(weight_dtype), "bf16")
