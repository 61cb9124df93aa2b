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
