"""The planner's second-tier bytes per token (`radixlm.plan.hicache.tier_bytes_per_token`)
against what radixlm's tiers store (`KVTier.stored_row_bytes` over the pool's buffers), for
every tiny family: grouped-query pools and DeepSeek's latent pool, raw and 8-bit rows."""

from __future__ import annotations

import pytest
import torch

from radixlm.plan.hicache import tier_bytes_per_token
from radixlm.plan.models import spec_from_config
from radixlm.runtime.executor.kv_tier.host import HostTier
from radixlm.runtime.executor.kv_tier.quant import Fp8Tier, Int8Tier
from tests.tiny_models import TINY_FAMILIES, tiny_config

TIERS = {"raw": HostTier, "fp8": Fp8Tier, "int8": Int8Tier}


def _pool_rows(config) -> list[tuple[int, ...]]:
    """One row shape per pool buffer, as the engine's pools lay them out."""
    text = config.get_text_config()
    layers = text.num_hidden_layers
    if getattr(text, "kv_lora_rank", None):
        return [(1, text.kv_lora_rank + text.qk_rope_head_dim)] * layers
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return [(text.num_key_value_heads, head_dim)] * (2 * layers)


@pytest.mark.parametrize("fmt", sorted(TIERS))
@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_planner_tier_bytes_equal_the_tiers(family, fmt):
    config = tiny_config(family)
    engine = sum(TIERS[fmt].stored_row_bytes(r, torch.float32) for r in _pool_rows(config))
    spec = spec_from_config(config.to_dict())
    assert tier_bytes_per_token(spec, "fp32", 1, fmt) == engine


def test_unknown_tier_format_is_refused():
    spec = spec_from_config(tiny_config("llama").to_dict())
    with pytest.raises(ValueError, match="tier_format"):
        tier_bytes_per_token(spec, "fp32", 1, "fp4")
