"""Weight memory (what must be resident) and weight traffic (what one step reads).

Memory: every parameter is resident, experts included. Quantized formats (fp8, int8,
int4 weight-only) quantize the linear layers inside the transformer blocks and keep the
embedding, LM head and norms in 16 bits, as published FP8 / GPTQ / AWQ checkpoints do
(e.g. DeepSeek-V3's FP8 release, AutoAWQ defaults); fp32 / bf16 / fp16 store everything
in that format. GGUF block formats follow llama.cpp's quantizer: q4_1 stores the block
linears in Q4_1 and the token embedding / LM head in Q8_0 (as the bundled SmolLM2 file
does), q8_0 stores both in Q8_0; norms stay fp32. (radixlm's CPU runtime also keeps an
fp32 copy of the embedding for row lookups; that copy is not counted here.)

Traffic per forward step (memory-bound decode is priced by it): every block weight a
token of the step uses, plus the LM head; the input embedding is a row lookup and reads
only a few rows (ignored). For an MoE layer, a step of `n` tokens reads the experts the
batch routes to. With uniform, independent top-k routing over E experts, one token
misses a given expert with probability (1 - k/E), so the expected number of distinct
experts a layer reads is
    E_active(n) = E * (1 - (1 - k/E)^n)
(balls-into-bins occupancy; routers are trained toward uniform load, e.g. the auxiliary
balance loss of Fedus et al. 2022 "Switch Transformers" and DeepSeek-V3's bias-based
balancing). Skewed routing touches fewer experts; this is the upper envelope.
"""

from __future__ import annotations

import math

from radixlm.plan.dtypes import DTYPE_BYTES, GGUF_DTYPES, normalize, weight_bytes_per_param
from radixlm.plan.models import ModelSpec

_QUANTIZED = {"fp8", "int8", "int4"}


def _unquantized_bytes(dtype: str) -> float:
    """Bytes per embedding / LM-head weight under weight format `dtype`."""
    name = normalize(dtype)
    if name in GGUF_DTYPES:
        return DTYPE_BYTES["q8_0"]
    return 2.0 if name in _QUANTIZED else weight_bytes_per_param(name)


def _norm_bytes(dtype: str) -> float:
    """Bytes per norm weight: fp32 in GGUF files, else as the embedding."""
    return DTYPE_BYTES["fp32"] if normalize(dtype) in GGUF_DTYPES else _unquantized_bytes(dtype)


def weights_bytes(model: ModelSpec, dtype: str = "bf16", group_size: int = 128) -> float:
    """Resident weight bytes of the whole model (all experts), see module doc."""
    block = model.block_linear_params() * weight_bytes_per_param(dtype, group_size)
    rest = model.embedding_params() + model.lm_head_params()
    return block + rest * _unquantized_bytes(dtype) + model.norm_params() * _norm_bytes(dtype)


def distinct_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts of `num_experts` that `tokens` tokens routed uniformly and
    independently, `top_k` distinct experts each, touch: E (1 - (1 - k/E)^n) (module doc)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def expected_distinct_experts(model: ModelSpec, tokens: float) -> float:
    """Expected routed experts a layer reads for `tokens` tokens (uniform top-k routing)."""
    if not model.is_moe:
        return 0.0
    return distinct_experts(model.num_experts, model.experts_per_token, tokens)


def tokens_for_expert_fraction(model: ModelSpec, fraction: float) -> int:
    """Smallest batch (tokens per step) whose expected active experts reach `fraction`
    of all experts: (1 - k/E)^n <= 1 - fraction  =>  n >= ln(1 - fraction) / ln(1 - k/E)."""
    if not model.is_moe:
        return 1
    e, k = model.num_experts, model.experts_per_token
    if k >= e or fraction <= 0:
        return 1
    return max(1, math.ceil(math.log(1.0 - fraction) / math.log(1.0 - k / e) - 1e-9))


def weights_read_bytes(
    model: ModelSpec, tokens: float = 1, dtype: str = "bf16", group_size: int = 128
) -> float:
    """Weight bytes one forward step over `tokens` tokens reads from memory."""
    per = weight_bytes_per_param(dtype, group_size)
    head = model.vocab_size * model.hidden_size * _unquantized_bytes(dtype)
    norms = model.norm_params() * _norm_bytes(dtype)
    if not model.is_moe:
        return model.block_linear_params() * per + head + norms
    dense_part = model.block_linear_params(active_only=True) - (
        model.num_moe_layers * model.experts_per_token * model.expert_params()
    )
    experts = model.num_moe_layers * expected_distinct_experts(model, tokens)
    return (dense_part + experts * model.expert_params()) * per + head + norms
