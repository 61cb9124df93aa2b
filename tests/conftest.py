"""Shared test settings: one compute thread per process (fastest on shared 2-core machines)."""

# radixlm before torch: `import radixlm` sets the OpenMP wait policy libgomp reads once.
import radixlm  # noqa: F401, I001
import pytest
import torch

torch.set_num_threads(1)


def pytest_sessionstart(session):
    """Convert the bundled GGUF model once, before any test runs: on a fresh machine the
    conversion's progress bar would otherwise land in the output of whichever test loads
    the model first (tests that check a command's exact stderr among them)."""
    from radixlm.errors import ModelNotFoundError
    from radixlm.runtime import local_hf_dir

    try:
        local_hf_dir("smollm2-135m")
    except ModelNotFoundError:
        pass  # the model package is not installed: the tests that need it skip or fail


@pytest.fixture(scope="session")
def cpu_kernels():
    """radixlm's compiled CPU kernels (`CpuKernels`); skips where they cannot be built."""
    from radixlm.kernels.cpu import CpuKernels

    kernels = CpuKernels.load()
    if kernels is None:
        pytest.skip("radixlm's CPU kernels cannot be built here (no C compiler or no AVX2)")
    return kernels


@pytest.fixture(params=["avx2", "avx512"])
def gemm_isa(request, cpu_kernels):
    """Runs the test on each instruction set of the packed GEMM (and the attention products
    that use its tiles) this CPU has, then restores the default."""
    default = cpu_kernels.gemm_isa()
    if cpu_kernels.gemm_isa(request.param == "avx512") != request.param:
        cpu_kernels.gemm_isa(default == "avx512")
        pytest.skip(f"the CPU lacks {request.param}")
    yield request.param
    cpu_kernels.gemm_isa(default == "avx512")
