"""Quantized checkpoints: detect the format from config.json's `quantization_config`, read
it into radixlm's canonical layouts (`kernels.quant_ref`), one reader class per format.

Readers: `CompressedTensorsQuant` (compressed-tensors W4A16 / W8A8 int8 / W8A8 fp8),
`GptqQuant`, `AwqQuant` (int4). `quant_format(config)` picks one; `load_quantized` reads a
checkpoint directory's quantized modules. See docs/quant-weights.md.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from radixlm.runtime.executor.quant.base import (
    W4A16,
    W8A8_FP8,
    W8A8_INT8,
    CheckpointQuant,
    QuantizedWeight,
    UnsupportedQuantizationError,
)
from radixlm.runtime.executor.quant.compressed_tensors import CompressedTensorsQuant
from radixlm.runtime.executor.quant.gptq_awq import AwqQuant, GptqQuant

__all__ = [
    "W4A16", "W8A8_FP8", "W8A8_INT8", "AwqQuant", "CheckpointQuant", "CompressedTensorsQuant",
    "GptqQuant", "QuantizedWeight", "UnsupportedQuantizationError", "load_quantized",
    "quant_format",
]  # fmt: skip

READERS: dict[str, type[CheckpointQuant]] = {
    "compressed-tensors": CompressedTensorsQuant,
    "gptq": GptqQuant,
    "awq": AwqQuant,
}


def quantization_config(config) -> dict | None:
    """config.json's `quantization_config` as a dict (None when absent)."""
    qcfg = getattr(config, "quantization_config", None)
    if qcfg is None:
        return None
    return qcfg if isinstance(qcfg, dict) else qcfg.to_dict()


def quant_format(config) -> CheckpointQuant | None:
    """The reader for `config`'s quantization_config, or None for an unquantized
    checkpoint. Raises UnsupportedQuantizationError naming an unknown `quant_method`."""
    qcfg = quantization_config(config)
    if qcfg is None:
        return None
    method = qcfg.get("quant_method")
    if method not in READERS:
        raise UnsupportedQuantizationError(
            f"quantization method {method!r} is not supported; radixlm reads {sorted(READERS)}"
        )
    return READERS[method](qcfg)


def load_quantized(hf_dir: Path, config) -> dict[str, QuantizedWeight]:
    """{module name: QuantizedWeight} of the quantized checkpoint in `hf_dir` (empty for an
    unquantized one). Raises UnsupportedQuantizationError as the format's reader."""
    reader = quant_format(config)
    if reader is None:
        return {}
    state: dict[str, torch.Tensor] = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        state.update(load_file(f, device="cpu"))
    return reader.convert(state)[1]
