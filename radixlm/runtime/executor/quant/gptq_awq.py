"""GPTQ and AWQ int4 safetensors checkpoints (AutoGPTQ / GPTQModel, AutoAWQ GEMM).

GPTQ (Frantar et al., 2022; AutoGPTQ's `QuantLinear` packing), per linear module M with
W [N, K]: `M.qweight` int32 [K / 8, N], element (k, n) at bits 4 (k % 8) of qweight[k // 8,
n]; `M.qzeros` int32 [K / G, N / 8], zero (g, n) at bits 4 (n % 8) of qzeros[g, n // 8],
stored minus one in v1 checkpoints (`checkpoint_format` "gptq", the default; "gptq_v2"
stores it as is); `M.scales` fp16 [K / G, N]; `M.g_idx` int32 [K], the group of each input
row (k // G unless `desc_act` reordered them). W[n, k] = scales[g, n] (q[k, n] - zero[g,
n]) with g = g_idx[k]; group_size -1 means one group (G = K).

AWQ GEMM (Lin et al., 2023; AutoAWQ `WQLinear_GEMM`): `M.qweight` int32 [K, N / 8] packed
along N with the interleaved order: nibble slot i of word j holds column 8 j + (0, 2, 4,
6, 1, 3, 5, 7)[i]; `M.qzeros` int32 [K / G, N / 8] packed the same way (no offset);
`M.scales` fp16 [K / G, N]; W[n, k] = scales[k // G, n] (q[k, n] - zero[k // G, n]).
"""

from __future__ import annotations

import torch

from radixlm.kernels import quant_ref
from radixlm.runtime.executor.quant.base import (
    W4A16,
    CheckpointQuant,
    QuantizedWeight,
    UnsupportedQuantizationError,
    check_w4,
)

#: AWQ's nibble slot i holds column AWQ_ORDER[i] of each group of 8 columns.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] of 8 nibbles each (slot i at bits 4i) -> uint8 [R, 8 C], slot order."""
    return quant_ref.unpack_int4(words.contiguous().view(torch.uint8).reshape(words.shape[0], -1))


class _Int4Quant(CheckpointQuant):
    """Shared checks and conversion of the int4 formats; subclasses unpack."""

    def __init__(self, qcfg: dict):
        super().__init__(qcfg)
        bits = qcfg.get("bits", qcfg.get("w_bit"))
        if bits != 4:
            raise UnsupportedQuantizationError(f"{self.method}: {bits}-bit weights not supported")
        self.group_size = int(qcfg.get("group_size", qcfg.get("q_group_size", -1)))

    def convert(self, state):
        out = dict(state)
        quantized = {}
        for module in sorted(k[: -len(".qweight")] for k in state if k.endswith(".qweight")):
            t = {s: out.pop(f"{module}.{s}") for s in self.tensors if f"{module}.{s}" in out}
            q, zeros, scales = self._unpack(module, t)  # [K, N], [K / G, N], [K / G, N]
            k, n = q.shape
            group = k if self.group_size == -1 else self.group_size
            check_w4(module, n, k, group, self.method)
            self._check_groups(module, t, k, group)
            if tuple(scales.shape) != (k // group, n):
                raise UnsupportedQuantizationError(
                    f"{self.method}: {module}: scales {tuple(scales.shape)} for group size {group}"
                )
            qw = QuantizedWeight(
                W4A16,
                quant_ref.pack_int4(q.t().contiguous()),
                scales.float().t().contiguous(),
                zeros[:, :n].t().contiguous(),
                group,
            )
            quantized[module] = qw
            out[f"{module}.weight"] = qw.dequantize()
        return out, quantized

    tensors: tuple[str, ...] = ()

    def _unpack(self, module: str, t: dict) -> tuple[torch.Tensor, ...]:
        """(q uint8 [K, N], zeros uint8 [K / G, >= N], scales [K / G, N]) of module's
        tensors `t`."""
        raise NotImplementedError

    def _check_groups(self, module: str, t: dict, k: int, group: int) -> None:
        """Raise UnsupportedQuantizationError unless input row k is in group k // G."""


class GptqQuant(_Int4Quant):
    """GPTQ int4 (v1 or v2 zeros); refuses `desc_act` checkpoints whose g_idx is not
    k // G (activation-ordered groups would need the input permuted)."""

    method = "gptq"
    tensors = ("qweight", "qzeros", "scales", "g_idx")

    def __init__(self, qcfg: dict):
        super().__init__(qcfg)
        fmt = qcfg.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise UnsupportedQuantizationError(f"gptq: checkpoint_format {fmt!r} not supported")
        self.zero_offset = 1 if fmt == "gptq" else 0

    def _unpack(self, module, t):
        q = unpack_rows(t["qweight"].t()).t()  # [N, K] slot order along K -> [K, N]
        zeros = (unpack_rows(t["qzeros"]) + self.zero_offset) & 15
        return q, zeros, t["scales"]

    def _check_groups(self, module, t, k, group):
        g_idx = t.get("g_idx")
        if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(k) // group):
            raise UnsupportedQuantizationError(
                f"gptq: {module} has desc_act (activation-order) groups, a g_idx other "
                "than k // group_size; radixlm takes contiguous groups only"
            )


class AwqQuant(_Int4Quant):
    """AWQ int4, GEMM layout with zero points."""

    method = "awq"
    tensors = ("qweight", "qzeros", "scales")

    def __init__(self, qcfg: dict):
        super().__init__(qcfg)
        version = str(qcfg.get("version", "gemm")).lower()
        if version != "gemm" or not qcfg.get("zero_point", True):
            raise UnsupportedQuantizationError(
                f"awq: version {version!r} (zero_point {qcfg.get('zero_point', True)}) not "
                "supported; radixlm reads the GEMM layout with zero points"
            )

    @staticmethod
    def _deinterleave(words: torch.Tensor) -> torch.Tensor:
        slots = unpack_rows(words)  # [R, 8 C] in slot order
        r, c8 = slots.shape
        cols = torch.empty_like(slots).reshape(r, c8 // 8, 8)
        cols[:, :, list(AWQ_ORDER)] = slots.reshape(r, c8 // 8, 8)
        return cols.reshape(r, c8)

    def _unpack(self, module, t):
        return self._deinterleave(t["qweight"]), self._deinterleave(t["qzeros"]), t["scales"]
