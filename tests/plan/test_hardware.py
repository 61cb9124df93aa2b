"""GPU table lookups, derating, and the on-the-spot CPU measurement."""

from __future__ import annotations

import pytest

from radixlm.plan.hardware import GPUS, derate, get_hardware, measure_cpu


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("H100 SXM", "H100-SXM"),
        ("h100", "H100-SXM"),
        ("H200", "H200"),
        ("A100 80GB", "A100-80GB"),
        ("a100", "A100-80GB"),
        ("L40S", "L40S"),
        ("b200", "B200"),
    ],
)
def test_lookup(name, key):
    assert get_hardware(name) is GPUS[key]


def test_unknown_gpu():
    with pytest.raises(ValueError, match="choose from"):
        get_hardware("tpu-v9")


def test_published_numbers():
    h100 = GPUS["H100-SXM"]
    assert h100.memory_bytes == 80e9 and h100.mem_bandwidth == 3.35e12
    assert h100.flops("bf16") == 989.5e12 and h100.flops("fp8") == 1979e12
    assert GPUS["A100-80GB"].flops("fp8") == GPUS["A100-80GB"].flops("bf16")  # no FP8
    assert GPUS["H200"].memory_bytes == 141e9


def test_derate():
    hw = derate(GPUS["H100-SXM"], 0.5, 0.8)
    assert hw.flops("bf16") == pytest.approx(989.5e12 * 0.5)
    assert hw.mem_bandwidth == pytest.approx(3.35e12 * 0.8)


def test_measure_cpu_plausible():
    cpu = measure_cpu(0.05)
    assert 1e9 < cpu.flops("fp32") < 1e13
    assert 1e8 < cpu.mem_bandwidth < 1e12
    assert cpu.measured and cpu.memory_bytes > 0
