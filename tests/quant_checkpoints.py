"""Test-side writers of quantized checkpoints, each written from its format's spec (not
from radixlm's reader): compressed-tensors (packing through the `compressed-tensors`
library itself), GPTQ v1 and AWQ GEMM. Each writer quantizes every decoder linear of a
saved fp32 model directory and returns the float32 weights the checkpoint encodes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _load(src: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(f))
    return state


def _save(src: Path, dst: Path, state: dict, qcfg: dict) -> None:
    if dst != src:
        shutil.copytree(src, dst, dirs_exist_ok=True)
    for f in dst.glob("*.safetensors"):
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, dst / "model.safetensors")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))


def linear_names(state: dict) -> list[str]:
    return sorted(k[:-7] for k in state if k.endswith(".weight") and k.split(".")[-2] in LINEARS)


def int4_groups(w: torch.Tensor, group: int, sym: bool, scale_dtype=torch.float16):
    """w [N, K] -> (q int64 [N, K] in 0..15, scales [N, K / G] of scale_dtype, zeros int64
    [N, K / G]) by min/max per group (symmetric: zero 8, scale absmax / 7)."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    if sym:
        scale = (g.abs().amax(-1) / 7).clamp_min(1e-6)
        zero = torch.full_like(scale, 8.0)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp_min(1e-6)
        zero = (-lo / scale).round().clamp(0, 15)
    scale = scale.to(scale_dtype)
    q = (g / scale.float()[..., None]).round() + zero[..., None]
    return q.clamp(0, 15).long().reshape(n, k), scale, zero.long()


def w4_value(q, scales, zeros, group: int) -> torch.Tensor:
    """scales * (q - zeros) in float32, groups along K of W [N, K]."""
    s = scales.float().repeat_interleave(group, dim=1)
    return s * (q - zeros.repeat_interleave(group, dim=1)).float()


def _int32_words(nibbles: torch.Tensor) -> torch.Tensor:
    """int64 [..., 8] nibbles -> int32 [...] with nibble i at bits 4i."""
    words = sum(nibbles[..., i] << (4 * i) for i in range(8))
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def write_compressed_tensors(
    src: Path, dst: Path, scheme: str, group: int = 32, static: bool = False
) -> dict[str, torch.Tensor]:
    """scheme "w4a16" / "w4a16_asym" (pack-quantized; group -1: per channel), "w8a8_int8"
    (int-quantized), "w8a8_fp8" (float-quantized); `static`: a per-tensor input_scale."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    state, want = _load(src), {}
    for name in linear_names(state):
        w = state.pop(f"{name}.weight").float()
        n, k = w.shape
        if scheme.startswith("w4a16"):
            g = k if group == -1 else group
            q, s, z = int4_groups(w, g, sym=scheme == "w4a16", scale_dtype=torch.bfloat16)
            state[f"{name}.weight_packed"] = pack_to_int32((q - 8).to(torch.int8), 4)
            state[f"{name}.weight_scale"] = s
            state[f"{name}.weight_shape"] = torch.tensor([n, k])
            if scheme == "w4a16_asym":
                state[f"{name}.weight_zero_point"] = pack_to_int32(
                    (z - 8).to(torch.int8), 4, packed_dim=0
                )
            want[name] = w4_value(q, s, z, g)
            continue
        fp8 = scheme == "w8a8_fp8"
        top = 448.0 if fp8 else 127.0
        s = (w.abs().amax(1, keepdim=True) / top).to(torch.bfloat16)
        scaled = w / s.float()
        q = (
            scaled.clamp(-top, top).to(torch.float8_e4m3fn)
            if fp8
            else scaled.round().to(torch.int8)
        )
        state[f"{name}.weight"], state[f"{name}.weight_scale"] = q, s
        if static:
            state[f"{name}.input_scale"] = torch.tensor([0.05], dtype=torch.bfloat16)
        want[name] = q.float() * s.float()
    kind = "float" if scheme == "w8a8_fp8" else "int"
    if scheme.startswith("w4a16"):
        strategy = "channel" if group == -1 else "group"
        weights = {"num_bits": 4, "type": "int", "symmetric": scheme == "w4a16",
                   "strategy": strategy, "group_size": None if group == -1 else group}  # fmt: skip
        acts, fmt = None, "pack-quantized"
    else:
        weights = {"num_bits": 8, "type": kind, "symmetric": True, "strategy": "channel"}
        acts = {"num_bits": 8, "type": kind, "symmetric": True, "dynamic": not static,
                "strategy": "tensor" if static else "token"}  # fmt: skip
        fmt = f"{kind}-quantized"
    qcfg = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": acts,
                "output_activations": None,
                "format": fmt,
            }  # fmt: skip
        },
        "ignore": ["lm_head"],
    }
    _save(src, dst, state, qcfg)
    return want


def write_gptq(src: Path, dst: Path, group: int = 32, desc_act: bool = False):
    """GPTQ v1 (zeros stored minus one), symmetric, fp16 scales; `desc_act` writes a
    permuted g_idx."""
    state, want = _load(src), {}
    for name in linear_names(state):
        w = state.pop(f"{name}.weight").float()
        n, k = w.shape
        g = k if group == -1 else group
        q, s, z = int4_groups(w, g, sym=True)
        qkn = q.t()  # [K, N]
        state[f"{name}.qweight"] = _int32_words(qkn.reshape(k // 8, 8, n).transpose(1, 2))
        zs = ((z - 1) & 15).t()  # [K / G, N]
        state[f"{name}.qzeros"] = _int32_words(zs.reshape(k // g, n // 8, 8))
        state[f"{name}.scales"] = s.t().contiguous()
        g_idx = torch.arange(k, dtype=torch.int32) // g
        state[f"{name}.g_idx"] = g_idx[torch.randperm(k)] if desc_act else g_idx
        want[name] = w4_value(q, s, z, g)
    qcfg = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": desc_act,
            "sym": True, "checkpoint_format": "gptq"}  # fmt: skip
    _save(src, dst, state, qcfg)
    return want


def _awq_words(v: torch.Tensor) -> torch.Tensor:
    """int64 [R, N] -> int32 [R, N / 8], nibble slot i of word j holding column 8 j +
    AWQ_ORDER[i]."""
    cols = v.reshape(v.shape[0], v.shape[1] // 8, 8)
    return _int32_words(cols[:, :, list(AWQ_ORDER)])


def write_awq(src: Path, dst: Path, group: int = 32):
    """AWQ GEMM: asymmetric, fp16 scales, qweight / qzeros in AWQ's interleaved order."""
    state, want = _load(src), {}
    for name in linear_names(state):
        w = state.pop(f"{name}.weight").float()
        n, k = w.shape
        q, s, z = int4_groups(w, group, sym=False)

        state[f"{name}.qweight"] = _awq_words(q.t())
        state[f"{name}.qzeros"] = _awq_words(z.t())
        state[f"{name}.scales"] = s.t().contiguous()
        want[name] = w4_value(q, s, z, group)
    qcfg = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
            "version": "gemm"}  # fmt: skip
    _save(src, dst, state, qcfg)
    return want
