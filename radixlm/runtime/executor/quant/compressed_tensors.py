"""compressed-tensors checkpoints (what llm-compressor writes and vLLM loads).

Spec (neuralmagic/compressed-tensors, `compressors/` and `quantization/quant_args.py`):
config.json's quantization_config has `config_groups` {name: {targets, weights,
input_activations, format}}, a global `format`, and `ignore` (module names or "re:"
regexes left in float). Per quantized linear module M:

* pack-quantized (int4): `M.weight_packed` int32 [N, K / 8], element k at bits 4 (k % 8) of
  word k // 8, stored as q + 8 (signed values offset to 0..15); `M.weight_scale` [N, K / G]
  (group) or [N, 1] (channel); `M.weight_shape` [N, K]; asymmetric schemes add
  `M.weight_zero_point` int32 [N / 8, K / G], packed the same way along N, also offset by
  8. W = scale * (q - zero_point) in signed values, i.e. canonical q = stored nibble and
  canonical zeros = stored zero nibble (8 when symmetric).
* int-quantized (int8) and float-quantized (fp8 e4m3): `M.weight` int8 / float8_e4m3fn
  [N, K], `M.weight_scale` [N, 1] (channel) or [1] (tensor), optional
  `M.weight_zero_point` (zero for the symmetric schemes radixlm takes), and with static
  activations `M.input_scale` (one value per tensor).
"""

from __future__ import annotations

import re

import torch

from radixlm.kernels import quant_ref
from radixlm.runtime.executor.quant.base import (
    W4A16,
    W8A8_FP8,
    W8A8_INT8,
    CheckpointQuant,
    QuantizedWeight,
    UnsupportedQuantizationError,
    check_w4,
    per_channel,
)

METHOD = "compressed-tensors"
FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized")
_SUFFIXES = (
    "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx",
    "input_scale", "input_zero_point",
)  # fmt: skip


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == name or name.endswith("." + pattern)


class CompressedTensorsQuant(CheckpointQuant):
    """Reads compressed-tensors W4A16 (pack-quantized), W8A8 int8 (int-quantized) and W8A8
    fp8 (float-quantized) linear layers into the canonical layouts."""

    method = METHOD

    def __init__(self, qcfg: dict):
        super().__init__(qcfg)
        self.groups = list((qcfg.get("config_groups") or {}).values())
        self.ignore = list(qcfg.get("ignore") or [])
        if not self.groups:
            raise UnsupportedQuantizationError(f"{METHOD}: no config_groups in the config")
        for group in self.groups:
            fmt = group.get("format") or qcfg.get("format")
            if fmt not in FORMATS:
                raise UnsupportedQuantizationError(
                    f"{METHOD}: format {fmt!r} is not supported; radixlm reads {FORMATS}"
                )

    def _group(self, module: str) -> dict:
        for group in self.groups:
            targets = group.get("targets") or []
            if any(t == "Linear" or _matches(t, module) for t in targets):
                return group
        raise UnsupportedQuantizationError(
            f"{METHOD}: {module} holds quantized tensors but no config group targets it"
        )

    def convert(self, state):
        modules = sorted(
            {k.rsplit(".", 1)[0] for k in state if k.endswith((".weight_packed", ".weight_scale"))}
        )
        out = dict(state)
        quantized = {}
        for module in modules:
            if any(_matches(p, module) for p in self.ignore):
                continue
            group = self._group(module)
            tensors = {s: out.pop(f"{module}.{s}") for s in _SUFFIXES if f"{module}.{s}" in out}
            if f"{module}.weight" in out:
                tensors["weight"] = out.pop(f"{module}.weight")
            qw = self._canonical(module, group, tensors)
            quantized[module] = qw
            out[f"{module}.weight"] = qw.dequantize()
        return out, quantized

    def _canonical(self, module: str, group: dict, t: dict) -> QuantizedWeight:
        w = group.get("weights") or {}
        bits, kind = w.get("num_bits"), w.get("type", "int")
        strategy, acts = w.get("strategy"), group.get("input_activations")
        scheme = f"{kind}{bits} weights, strategy {strategy}"
        if w.get("actorder") not in (None, False) or "weight_g_idx" in t:
            raise UnsupportedQuantizationError(
                f"{METHOD}: {module} uses activation ordering (actorder / weight_g_idx); "
                "radixlm takes contiguous groups only"
            )
        if "weight_packed" in t:
            if (bits, kind) != (4, "int") or strategy not in ("group", "channel"):
                raise UnsupportedQuantizationError(f"{METHOD}: {module}: {scheme} not supported")
            return self._w4(module, t, w)
        weight = t.get("weight")
        if weight is None or "weight_scale" not in t:
            raise UnsupportedQuantizationError(f"{METHOD}: {module} lacks weight / weight_scale")
        if strategy not in ("channel", "tensor") or bits != 8:
            raise UnsupportedQuantizationError(f"{METHOD}: {module}: {scheme} not supported")
        zp = t.get("weight_zero_point")
        if not w.get("symmetric", True) or (zp is not None and bool(zp.any())):
            raise UnsupportedQuantizationError(f"{METHOD}: {module}: asymmetric 8-bit weights")
        n = weight.shape[0]
        w_scale = per_channel(t["weight_scale"], n, module, METHOD)
        act_scale = self._act_scale(module, acts, t, kind)
        if kind == "int" and weight.dtype == torch.int8:
            if acts is None:
                raise UnsupportedQuantizationError(
                    f"{METHOD}: {module}: int8 weight-only (W8A16) is not supported"
                )
            return QuantizedWeight(W8A8_INT8, weight, w_scale, act_scale=act_scale)
        if kind == "float" and weight.dtype == torch.float8_e4m3fn:
            return QuantizedWeight(W8A8_FP8, weight, w_scale, act_scale=act_scale)
        raise UnsupportedQuantizationError(
            f"{METHOD}: {module}: {scheme} stored as {weight.dtype} not supported"
        )

    @staticmethod
    def _act_scale(module: str, acts: dict | None, t: dict, kind: str) -> torch.Tensor | None:
        if acts is None or acts.get("dynamic", False):
            if acts is not None and acts.get("strategy") not in ("token", None):
                raise UnsupportedQuantizationError(
                    f"{METHOD}: {module}: dynamic activations of strategy "
                    f"{acts.get('strategy')!r}; radixlm takes per-token"
                )
            return None
        if acts.get("type", kind) != kind or acts.get("num_bits") != 8:
            raise UnsupportedQuantizationError(f"{METHOD}: {module}: activations {acts}")
        scale = t.get("input_scale")
        zp = t.get("input_zero_point")
        if scale is None or scale.numel() != 1 or (zp is not None and bool(zp.any())):
            raise UnsupportedQuantizationError(
                f"{METHOD}: {module}: static activations need one symmetric input_scale"
            )
        return scale.float().reshape(())

    @staticmethod
    def _w4(module: str, t: dict, w: dict) -> QuantizedWeight:
        packed = t["weight_packed"]
        n, k = (int(v) for v in t["weight_shape"].tolist())
        if packed.dtype != torch.int32 or tuple(packed.shape) != (n, k // 8) or k % 8:
            raise UnsupportedQuantizationError(
                f"{METHOD}: {module}: weight_packed {tuple(packed.shape)} does not hold {n} x {k}"
            )
        scale = t["weight_scale"].float()
        group = k if w.get("strategy") == "channel" else int(w.get("group_size") or 0)
        check_w4(module, n, k, group, METHOD)
        if tuple(scale.shape) != (n, k // group):
            raise UnsupportedQuantizationError(
                f"{METHOD}: {module}: weight_scale {tuple(scale.shape)} for group size {group}"
            )
        # Little-endian int32 words: byte j of a row holds elements 2j (low) and 2j + 1.
        qpacked = packed.contiguous().view(torch.uint8).reshape(n, k // 2)
        if w.get("symmetric", True):
            zeros = torch.full((n, k // group), 8, dtype=torch.uint8)
        else:
            zp = t["weight_zero_point"].t().contiguous()  # int32 [K / G, ceil(N / 8)]
            nib = quant_ref.unpack_int4(zp.view(torch.uint8).reshape(k // group, -1))
            zeros = nib[:, :n].t().contiguous()
        return QuantizedWeight(W4A16, qpacked.clone(), scale.contiguous(), zeros, group)
