"""Shared test settings: one compute thread per process (fastest on shared 2-core machines)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def cpu_kernels():
    """radixlm's compiled CPU kernels (`CpuKernels`); skips where they cannot be built."""
    from radixlm.kernels.cpu import CpuKernels

    kernels = CpuKernels.load()
    if kernels is None:
        pytest.skip("radixlm's CPU kernels cannot be built here (no C compiler or no AVX2)")
    return kernels
