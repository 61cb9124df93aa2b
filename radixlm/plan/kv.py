"""KV-cache size per token, per sequence and per GPU, for MHA, GQA, MQA and MLA.

Derivations:
  * MHA / GQA / MQA (Vaswani et al. 2017; GQA: Ainslie et al. 2023; MQA: Shazeer 2019):
    each layer caches one key and one value vector of `head_dim` elements per KV head,
        bytes/token = num_layers * num_kv_heads * head_dim * 2 * dtype_bytes.
    Llama-3-70B in bf16: 80 * 8 * 128 * 2 * 2 = 327,680 bytes.
  * MLA (DeepSeek-V2, Liu et al. 2024, section 2.1; DeepSeek-V3 report, section 2.1.1):
    each layer caches the compressed joint KV latent c_t^KV (d_c = kv_lora_rank elements)
    and one decoupled RoPE key k_t^R (d_h^R = qk_rope_head_dim elements) shared by all
    heads; K and V are re-expanded from the latent (or the up-projections are absorbed
    into the query and output projections), so
        bytes/token = num_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes.
    DeepSeek-V3 in bf16: 61 * (512 + 64) * 2 = 70,272 bytes.
    Caching the expanded per-head K and V instead (as some generic implementations do)
    costs num_layers * num_heads * (qk_nope + qk_rope + v_head_dim) * dtype_bytes.

Tensor parallelism: attention heads are split across `tp` GPUs. A GQA model with fewer KV
heads than GPUs cannot split a KV head, so each GPU keeps ceil(num_kv_heads / tp) >= 1
heads and the KV heads are replicated tp / num_kv_heads times across the group (the
layout of vLLM and SGLang). MLA's latent is shared by all heads, so under plain TP every
GPU holds the whole latent (replication factor tp); DP-attention avoids that and is out of
scope here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixlm.plan.dtypes import dtype_bytes
from radixlm.plan.models import ModelSpec
from radixlm.plan.validate import NON_NEGATIVE_INT, POSITIVE_INT


def kv_elements_per_token_per_layer(model: ModelSpec) -> int:
    """Cached elements per token in one layer (K and V together, or latent + RoPE key)."""
    if model.attention == "mla":
        return model.kv_lora_rank + model.qk_rope_head_dim
    return 2 * model.num_kv_heads * model.head_dim


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes one token occupies across all layers (whole model, no TP)."""
    return model.num_layers * kv_elements_per_token_per_layer(model) * dtype_bytes(kv_dtype)


def kv_bytes_per_sequence(model: ModelSpec, context: int, kv_dtype: str = "bf16") -> float:
    """Bytes of KV cache one sequence of `context` tokens holds."""
    NON_NEGATIVE_INT.check("context", context)
    return context * kv_bytes_per_token(model, kv_dtype)


def mla_expanded_bytes_per_token(model: ModelSpec, kv_dtype: str = "bf16") -> float:
    """MLA cache cost if per-head K and V were stored instead of the latent."""
    per_head = model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim
    return model.num_layers * model.num_heads * per_head * dtype_bytes(kv_dtype)


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each of `tp` GPUs stores: ceil(num_kv_heads / tp), never below one."""
    POSITIVE_INT.check("tp", tp)
    if model.attention == "mla":
        return 1
    return max(1, math.ceil(model.num_kv_heads / tp))


def kv_replication(model: ModelSpec, tp: int) -> float:
    """How many copies of each KV head (or MLA latent) the TP group holds (1 = none)."""
    POSITIVE_INT.check("tp", tp)
    if model.attention == "mla":
        return float(tp)
    return tp * kv_heads_per_gpu(model, tp) / model.num_kv_heads


def kv_bytes_per_token_per_gpu(model: ModelSpec, kv_dtype: str = "bf16", tp: int = 1) -> float:
    """KV bytes per token on one GPU of a `tp`-way tensor-parallel group."""
    POSITIVE_INT.check("tp", tp)
    if model.attention == "mla":
        return kv_bytes_per_token(model, kv_dtype)
    b = dtype_bytes(kv_dtype)
    return model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * 2 * b


@dataclass(frozen=True)
class LayoutRow:
    """The KV cost of one attention layout with the model's other dimensions kept."""

    layout: str
    kv_heads: int
    bytes_per_token: float
    ratio_to_model: float


def layout_variants(model: ModelSpec, kv_dtype: str = "bf16") -> list[LayoutRow]:
    """KV bytes/token if the same model used MHA, its own layout, MQA, or (for MLA
    models) the expanded per-head cache — ratios are relative to the model's layout."""
    own = kv_bytes_per_token(model, kv_dtype)
    b = dtype_bytes(kv_dtype)
    rows: list[LayoutRow] = []
    if model.attention == "mla":
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        mha = model.num_layers * model.num_heads * (qk + model.v_head_dim) * b
        rows.append(LayoutRow("mha (expanded K,V)", model.num_heads, mha, mha / own))
        rows.append(LayoutRow("mla (latent + rope key)", 0, own, 1.0))
        mqa = model.num_layers * (qk + model.v_head_dim) * b
        rows.append(LayoutRow("mqa (1 K,V head)", 1, mqa, mqa / own))
        return rows
    per_head = model.num_layers * model.head_dim * 2 * b
    rows.append(
        LayoutRow(
            "mha", model.num_heads, model.num_heads * per_head, model.num_heads * per_head / own
        )
    )
    if model.attention == "gqa":
        rows.append(LayoutRow("gqa (model)", model.num_kv_heads, own, 1.0))
    rows.append(LayoutRow("mqa", 1, per_head, per_head / own))
    return rows


def compare_models(models: list[ModelSpec], kv_dtype: str, context: int) -> list[dict]:
    """Per-model KV bytes/token and per-sequence bytes, and the ratio to the first model.

    The ratio answers "how many times more context fits in the same memory": a model with
    ratio r holds 1/r times the first model's tokens per byte of KV budget.
    """
    base = kv_bytes_per_token(models[0], kv_dtype)
    out = []
    for m in models:
        per_token = kv_bytes_per_token(m, kv_dtype)
        out.append(
            {
                "model": m.name,
                "attention": m.attention,
                "bytes_per_token": per_token,
                "bytes_per_sequence": per_token * context,
                "ratio_to_first": per_token / base,
                "tokens_per_gib": (1 << 30) / per_token,
            }
        )
    return out
