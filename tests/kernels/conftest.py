"""Kernel tests run the Triton kernels under the interpreter on CPU tensors unless
TRITON_INTERPRET=0 is set explicitly (the GPU check), in which case they compile for CUDA.

The variable must be set before any Triton kernel is decorated, hence at conftest import.
"""

from __future__ import annotations

import os

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
    """The bundled model's directory (its tokenizer files serve the tiny random models);
    skips when the model is not installed (e.g. a bare GPU machine)."""
    from radixlm.errors import ModelNotFoundError
    from radixlm.runtime.model_registry import local_hf_dir

    try:
        return local_hf_dir("smollm2-135m")
    except ModelNotFoundError as e:
        pytest.skip(f"bundled model not installed: {e}")
