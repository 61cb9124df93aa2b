"""The roofline of benchmarks/machine.py on hand-computed workloads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from machine import cpu_busy, model_params, roofline, workload_work  # noqa: E402


def _single(*requests):
    return {"sessions": [{"turns": [[ids, out]], "resend_history": False} for ids, out in requests]}


def test_shared_prefixes_are_prefilled_once():
    seen: list[list[int]] = []
    work = workload_work(_single(([1, 2, 3, 4], 3), ([1, 2, 3, 9, 9], 2)), seen)
    # 4 new tokens, then 5 of which the first 3 are cached; outputs 3 + 2
    assert work == {"prefill_tokens": 4 + 2, "decode_tokens": 2 + 1, "output_tokens": 5,
                    "passes": 3}  # fmt: skip
    # the same prompt again, in a later workload: only its last token is prefilled
    again = workload_work(_single(([1, 2, 3, 4], 1)), seen)
    assert again == {"prefill_tokens": 1, "decode_tokens": 0, "output_tokens": 1, "passes": 1}


def test_multi_turn_sessions_prefill_only_the_new_turn():
    wl = {"sessions": [{"turns": [[[5, 6], 2], [[7, 7, 7], 4]], "resend_history": True}]}
    work = workload_work(wl, [])
    # turn 0: 2 tokens; turn 1: 3 new + the last answer token; passes = 2 + 4
    assert work == {"prefill_tokens": 2 + 4, "decode_tokens": 1 + 3, "output_tokens": 6,
                    "passes": 6}  # fmt: skip


def test_roofline_takes_the_binding_roof():
    work = {"prefill_tokens": 6, "decode_tokens": 3, "output_tokens": 5, "passes": 3}
    # FLOPs 2*10*9 + 2*5*5 = 230: 0.23 s at 1000 FLOP/s; memory 3 * 100 B / 50 B/s = 6 s
    # without overlap: prefill 2*10*6 = 120 FLOPs (0.12 s), then max(decode 110 FLOPs
    # (0.11 s), 6 s of weight reads)
    slow_memory = roofline(work, 10, 5, 100, peak=1000.0, bandwidth=50.0)
    assert slow_memory.pop("bound") == "memory"
    assert slow_memory == pytest.approx({"flops": 230, "seconds": 6.0, "tokens_per_s": 5 / 6.0,
                                         "serial_seconds": 6.12,
                                         "serial_tokens_per_s": 5 / 6.12})  # fmt: skip
    slow_compute = roofline(work, 10, 5, 100, peak=10.0, bandwidth=1e6)
    assert slow_compute["bound"] == "compute"
    assert slow_compute["seconds"] == pytest.approx(23.0)
    # compute-bound both ways: 12 s of prefill + 11 s of decode = the roofline's 23 s
    assert slow_compute["serial_seconds"] == pytest.approx(23.0)


def test_cpu_busy_is_a_fraction():
    assert 0.0 <= cpu_busy(0.05) <= 1.0


def test_degenerate_workloads_give_zero_not_errors():
    empty = workload_work({"sessions": []}, [])
    assert empty == {"prefill_tokens": 0, "decode_tokens": 0, "output_tokens": 0, "passes": 0}
    assert roofline(empty, 10, 5, 100, peak=1.0, bandwidth=1.0)["tokens_per_s"] == 0.0
    no_output = workload_work(_single(([1, 2], 0)), [])
    assert no_output["decode_tokens"] == 0 and no_output["output_tokens"] == 0


@pytest.mark.parametrize("tied", [True, False])
def test_model_params_split_body_and_logits(tmp_path, tied):
    import torch
    from safetensors.torch import save_file

    tensors = {
        "model.embed_tokens.weight": torch.zeros(10, 4),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(6, 4),
        "model.norm.weight": torch.zeros(4),
    }
    if not tied:
        tensors["lm_head.weight"] = torch.zeros(10, 4)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    body, logits, nbytes = model_params(tmp_path)
    assert (body, logits) == (6 * 4 + 4, 10 * 4)
    assert nbytes == (tmp_path / "model.safetensors").stat().st_size
