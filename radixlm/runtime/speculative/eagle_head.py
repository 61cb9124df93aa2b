"""The EAGLE draft head: one decoder layer over (token embedding, target feature) pairs.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty") drafts at the feature level. Element p of the head's sequence pairs the
target's last hidden state f_p (the normed state its lm_head reads at position p) with
the next token t_{p+1}:

    x_p = fc([embed(t_{p+1}); f_p])            fc: Linear(2H -> H)
    o_p = DecoderLayer(x_p | x_<p)             one Llama block, its own KV (slot of p)
    o_p ~ f_{p+1},  lm_head(o_p) -> distribution of t_{p+2}

The embedding and lm_head are the target's (shared, not stored). Files: `eagle.json`
(`EagleConfig`) and `model.safetensors` (fc.* and layer.* only).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import ForwardBatch
from radixlm.runtime.executor.layers import TorchLayers
from radixlm.runtime.executor.layers.blocks import AttentionOptions, RotaryEmbedding

CONFIG_NAME = "eagle.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass
class EagleConfig:
    """Shape of a head; must match the target's hidden size and attention layout.

    Attributes:
        base_model: the target it was trained for (informational).
        intermediate_size: the head's FFN width (may be smaller than the target's).
        train_command: how the head was produced (informational).
    """

    base_model: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    train_command: str = ""

    def layer_config(self, target_config):
        """A copy of the target's transformers config with the head's FFN width, used to
        build the decoder layer and RoPE exactly like the target's."""
        cfg = target_config.__class__.from_dict(target_config.to_dict())
        cfg.intermediate_size = self.intermediate_size
        cfg.num_hidden_layers = 1
        return cfg

    def save(self, out_dir: Path) -> None:
        (Path(out_dir) / CONFIG_NAME).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> EagleConfig:
        """Raises FileNotFoundError when `path` has no eagle.json."""
        return cls(**json.loads((Path(path) / CONFIG_NAME).read_text()))


class EagleHead(nn.Module):
    """fc + one decoder layer. `embed` and `lm_head` are the target's modules.

    Args:
        cfg: the head's shape. target_config: the target's transformers config.
        embed: target embedding (nn.Embedding). lm_head: target head (nn.Linear).
    """

    def __init__(self, cfg: EagleConfig, target_config, embed: nn.Module, lm_head: nn.Module):
        super().__init__()
        layer_cfg = cfg.layer_config(target_config)
        h = cfg.hidden_size
        self.cfg = cfg
        self.fc = nn.Linear(2 * h, h, bias=True)
        bias = getattr(layer_cfg, "attention_bias", False)
        # Plain torch modules: the head is trained as such and loads by their names.
        opts = AttentionOptions(qkv_bias=bool(bias))
        self.layer = TorchLayers().decoder_layer(layer_cfg, 0, opts, "layer")
        self.rotary = RotaryEmbedding(layer_cfg)
        # Shared with the target; kept out of the state dict.
        object.__setattr__(self, "embed", embed)
        object.__setattr__(self, "lm_head", lm_head)

    def forward(self, fb: ForwardBatch, backend, features: torch.Tensor) -> torch.Tensor:
        """Head outputs o [T, H] for elements (fb.input_ids = t_{p+1}, features = f_p
        float [T, H]) at fb.positions; the backend stores and reads the head's KV."""
        x = self.fc(torch.cat([self.embed(fb.input_ids), features.to(self.fc.weight.dtype)], -1))
        rope = self.rotary(fb.positions, x.dtype)
        return self.layer(x, rope, backend, fb)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """float32 [T, vocab] draft logits from head outputs [T, H]."""
        return self.lm_head(out).float()

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.state_dict().items()}


class DenseCausalBackend:
    """Attention for training/feature extraction: B sequences of L tokens laid out
    [B * L], causal SDPA, no KV pool (set `shape = (B, L)` before each forward)."""

    def __init__(self, scaling: float):
        self.scaling = scaling
        self.shape = (1, 0)

    def forward(self, q, k, v, layer_id, fb):
        b, n = self.shape
        q, k, v = (t.view(b, n, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scaling, enable_gqa=True
        )
        return o.transpose(1, 2).reshape(b * n, *o.shape[1:2], o.shape[-1])
