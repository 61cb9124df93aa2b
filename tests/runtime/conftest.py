"""Fixtures for engine tests on the bundled SmolLM2-135M: prompts and transformers references."""

from __future__ import annotations

import json.decoder
from pathlib import Path

import pytest
import torch

from radixlm.runtime.executor.model_registry import local_hf_dir

MODEL = "smollm2-135m"
MAX_NEW = 16


@pytest.fixture(scope="session")
def hf_dir() -> Path:
    return local_hf_dir(MODEL)


@pytest.fixture(scope="session")
def tokenizer(hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    """Eight prompts as token ids: short, medium, ~1,500 tokens, chat-templated."""
    texts = [
        "Once upon a time",
        "The capital of France is",
        "def fibonacci(n):",
        "List three colors:",
        "Translate to French: I like apples. ->",
    ]
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    source = Path(json.decoder.__file__).read_text()
    long_ids = tokenizer.encode(source, add_special_tokens=False)
    long_ids = (long_ids * 2)[:1500]
    ids.append(long_ids)
    for question in ["What is the tallest mountain?", "Write a haiku about the sea."]:
        ids.append(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": question}],
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
        )
    return ids


@pytest.fixture(scope="session")
def reference(hf_dir, prompts) -> list[list[int]]:
    """transformers greedy continuations (fp32, do_sample=False), one prompt at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    outs = hf_greedy(model, prompts, MAX_NEW, eos_token_id=model.config.eos_token_id)
    del model
    return outs


def hf_greedy(
    model, prompts: list[list[int]], max_new_tokens: int, eos_token_id
) -> list[list[int]]:
    """transformers `generate(do_sample=False)` continuations, one prompt at a time."""
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=2,
                eos_token_id=eos_token_id,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs


def greedy(max_new_tokens: int = MAX_NEW) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 0}
