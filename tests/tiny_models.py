"""Random-initialised small models saved as Hugging Face directories, for tests that need
a model architecture other than the bundled one (or a cheaper one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def save_random_model(config, path: Path, hf_dir: Path):
    """Build `config`'s causal LM with seeded N(0, 0.3) weights (larger than the default
    init, so logits are not flat and greedy ties are rare), save it with the bundled
    model's tokenizer files under `path`, and return the fp32 transformers model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, path / name)
    return model
