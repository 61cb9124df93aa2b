"""Workload builders on the bundled tokenizer, and the sweep plot."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from radixlm.bench import workloads as wl
from radixlm.bench.sweep import analyze, plot_sweep
from radixlm.runtime.model_registry import local_hf_dir


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(local_hf_dir("smollm2-135m"))


def n_tokens(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def test_random_lengths_follow_the_range(tok):
    sessions = wl.random_workload(tok, 20, input_len=40, output_len=10, range_ratio=0.5, seed=3)
    assert len(sessions) == 20
    outs = [s.turns[0].output_len for s in sessions]
    assert all(5 <= n <= 10 for n in outs) and len(set(outs)) > 1
    # Decoded random tokens re-encode to about the requested length.
    lens = [n_tokens(tok, s.turns[0].text) for s in sessions]
    assert all(15 <= n <= 60 for n in lens)
    again = wl.random_workload(tok, 20, input_len=40, output_len=10, range_ratio=0.5, seed=3)
    assert again == sessions  # seeded
    with pytest.raises(ValueError):
        wl.random_workload(tok, 1, 10, 10, range_ratio=1.5)


def test_shared_prefix_groups_share_their_system_prompt(tok):
    sessions = wl.shared_prefix_workload(tok, 3, 4, system_len=30, question_len=5, output_len=7)
    texts = [s.turns[0].text for s in sessions]
    assert len(texts) == 12 and len(set(texts)) == 12
    prefixes = {t[:40] for t in texts}
    assert len(prefixes) == 3  # one system prompt per group
    assert all(s.turns[0].output_len == 7 for s in sessions)


def test_multi_turn_sessions(tok):
    sessions = wl.multi_turn_workload(tok, 2, 3, system_len=20, turn_len=5, output_len=4)
    assert [s.num_requests() for s in sessions] == [3, 3]
    assert all(s.resend_history for s in sessions)


def test_sharegpt_file(tok, tmp_path):
    long_answer = "The answer has enough words to count as a real reply here."
    data = [
        {"conversations": [{"from": "human", "value": "What is the capital of France?"},
                           {"from": "gpt", "value": long_answer}]},
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
        {"conversations": [{"from": "human", "value": "Only one turn"}]},
    ]  # fmt: skip
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    sessions = wl.sharegpt_workload(tok, path, num_prompts=10)
    assert len(sessions) == 1  # "Hi" is too short, the last has no answer
    assert sessions[0].turns[0].text == "What is the capital of France?"
    assert sessions[0].turns[0].output_len == n_tokens(tok, long_answer)
    assert wl.sharegpt_workload(tok, path, 10, output_len=9)[0].turns[0].output_len == 9
    path.write_text("{}")
    with pytest.raises(ValueError):
        wl.sharegpt_workload(tok, path, 10)


def test_sweep_plot_writes_a_png(tmp_path):
    def point(rate, tput, ttft, tpot):
        return {"request_rate": rate, "output_throughput": tput,
                "ttft_ms": {"p99": ttft}, "tpot_ms": {"p99": tpot}}  # fmt: skip

    pts = [point(1, 10, 100, 50), point(2, 19, 150, 60), point(4, 30, 900, 130)]
    a = analyze(pts, 1000, 100)
    out = plot_sweep(pts, a, tmp_path / "sweep.png", 1000, 100)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
