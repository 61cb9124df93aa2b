"""Build a model from a Hugging Face directory of safetensors files."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from radixlm.runtime.executor.models import get_model_class

logger = logging.getLogger(__name__)


def load_model(hf_dir: Path, config, dtype: torch.dtype, device: str) -> nn.Module:
    """Instantiate the architecture of `config` and load every *.safetensors in `hf_dir`.

    Tensors are cast to `dtype`. A tied lm_head (absent from the files) shares the
    embedding. Raises RuntimeError naming missing or unexpected tensors.
    """
    cls = get_model_class(config)
    with torch.device("meta"):
        model = cls(config)
    state: dict[str, torch.Tensor] = {}
    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {hf_dir}")
    for f in files:
        state.update(load_file(f, device="cpu"))
    state = {k: v.to(dtype) for k, v in state.items()}
    tied = getattr(config, "tie_word_embeddings", False)
    if tied:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weights mismatch: missing={missing} unexpected={unexpected}")
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the model's unique parameters (a tied head counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total
