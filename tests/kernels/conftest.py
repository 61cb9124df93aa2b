"""Kernel tests run the Triton kernels under the interpreter on CPU tensors unless
TRITON_INTERPRET=0 is set explicitly (the GPU check), in which case they compile for CUDA.

The variable must be set before any Triton kernel is decorated, hence at conftest import.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> str:
    """Where kernel tests put tensors: cpu under the interpreter, else cuda (or skip)."""
    pytest.importorskip("triton")
    if os.environ["TRITON_INTERPRET"] == "1":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 compiles Triton kernels, which needs CUDA")
    return "cuda"


@pytest.fixture(scope="session")
def hf_dir():
    """The bundled model's directory (its tokenizer files serve the tiny random models),
    or RADIXLM_TEST_TOKENIZER_DIR where set: a directory holding just the bundled model's
    tokenizer.json and tokenizer_config.json, for a GPU machine that cannot hold the model
    (a device run carries at most 64 MiB; the GGUF is 94 MB). Skips when neither is there."""
    from radixlm.errors import ModelNotFoundError
    from radixlm.runtime.executor.model_registry import local_hf_dir

    if os.environ.get("RADIXLM_TEST_TOKENIZER_DIR"):
        return Path(os.environ["RADIXLM_TEST_TOKENIZER_DIR"])
    try:
        return local_hf_dir("smollm2-135m")
    except ModelNotFoundError as e:
        pytest.skip(f"bundled model not installed: {e}")
