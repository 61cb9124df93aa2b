"""The KV cache's storage dtype (`--kv-cache-dtype`): the name resolved to a torch dtype,
an fp8 pool's per-layer scales read from the checkpoint, and the combinations refused at
start (docs/quant-kv.md).

Checkpoint scales: the names quantization tools write for a static per-tensor KV scheme
(llm-compressor's ``kv_cache_scheme`` in compressed-tensors, as vLLM loads them):
``model.layers.N.self_attn.k_scale`` / ``v_scale``, the older
``model.layers.N.self_attn.k_proj.output_scale`` / ``v_proj.output_scale``, and
``...self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` (ModelOpt). Each holds dequantization
scales (read value = stored * scale); a tensor of several values (one per KV head) counts
as its largest, which can only widen the range of every head. Without such tensors every
scale is 1.0: fp8 e4m3 then holds |x| <= 448 and e5m2 |x| <= 57344, saturating beyond,
which is deterministic and independent of the requests served.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch
from safetensors import safe_open

from radixlm.kernels.fp8 import FP8_DTYPES, KVScales

logger = logging.getLogger(__name__)

#: `--kv-cache-dtype` name -> storage dtype ('auto' is the model dtype).
KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    **FP8_DTYPES,
}

_SCALE_NAME = re.compile(
    r"^model\.layers\.(\d+)\.self_attn\."
    r"(?:([kv])_scale|([kv])_proj\.output_scale|([kv])_proj\.[kv]_scale)$"
)


def is_kv_scale_name(name: str) -> bool:
    """Whether checkpoint tensor `name` is a KV-cache scale (module doc), which the
    weight loader leaves to `read_kv_scales`."""
    return _SCALE_NAME.match(name) is not None


def kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's storage dtype for `--kv-cache-dtype name` ('auto': `model_dtype`)."""
    return model_dtype if name == "auto" else KV_CACHE_DTYPES[name]


def read_kv_scales(hf_dir: Path, num_layers: int) -> KVScales | None:
    """The checkpoint's KV scales (module doc) for `num_layers` layers, None when it has
    none. Raises ValueError when it has some but not a K and a V scale for every layer,
    or one that is not finite and > 0."""
    found: dict[tuple[str, int], float] = {}
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                m = _SCALE_NAME.match(key)
                if m is not None:
                    kind = m.group(2) or m.group(3) or m.group(4)
                    found[kind, int(m.group(1))] = float(f.get_tensor(key).float().max())
    if not found:
        return None
    missing = [f"{kind}{i}" for i in range(num_layers) for kind in "kv" if (kind, i) not in found]
    if missing:
        raise ValueError(
            f"the checkpoint has KV cache scales but none for (kind, layer) {missing[:8]}"
        )
    scales = KVScales(
        tuple(found["k", i] for i in range(num_layers)),
        tuple(found["v", i] for i in range(num_layers)),
    )
    logger.info(
        "KV cache scales from the checkpoint: K max %.4g, V max %.4g", max(scales.k), max(scales.v)
    )
    return scales
