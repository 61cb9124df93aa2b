"""Workload builders on the bundled tokenizer, and the sweep plot."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from radixlm.bench import workloads as wl
from radixlm.bench.sweep import analyze, plot_sweep
from radixlm.runtime.executor.model_registry import local_hf_dir


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


def test_sharegpt_pairs_skip_malformed_entries_and_are_not_shuffled_in_place(tok, tmp_path):
    answer = "A reply that is long enough to be counted as one."
    data = [
        "not a conversation",
        {"conversations": [{"from": "human", "value": "What is two plus two?"},
                           {"from": "gpt", "value": answer}]},
        {"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "x"}]},
        {"conversations": [["human", "hi"], ["gpt", "hello"]]},
        {"conversation": [{"value": "Name three primary colours."}, {"value": answer}]},
    ]  # fmt: skip
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    pairs = wl.read_sharegpt(path)
    assert pairs == [("What is two plus two?", answer), ("Name three primary colours.", answer)]
    sessions = wl.sharegpt_workload(tok, pairs, num_prompts=2, seed=1)
    assert pairs == wl.read_sharegpt(path)  # the caller's list keeps its order
    assert sessions == wl.sharegpt_workload(tok, path, num_prompts=2, seed=1)
    assert sorted(s.turns[0].text for s in sessions) == [p for p, _ in sorted(pairs)]


@pytest.mark.parametrize(
    "content, message",
    [
        ("[1, 2", "is not valid JSON (Expecting ',' delimiter at line 1 column 6)"),
        ('{"conversations": []}', "is not a JSON list; expected a JSON list of"),
        ("[]", "has no conversation with two text turns among its 0 entries"),
        ('[{"conversations": [{"value": "only one"}]}]', "has no conversation with two"),
    ],
)
def test_malformed_sharegpt_files_are_named_in_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError) as exc:
        wl.read_sharegpt(path)
    assert str(exc.value).startswith(f"dataset file {str(path)!r} ")
    assert message in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="does not exist"):
        wl.read_sharegpt(tmp_path / "missing.json")


def test_sharegpt_without_a_fitting_conversation(tok, tmp_path):
    path = tmp_path / "short.json"
    path.write_text(json.dumps([{"conversations": [{"value": "Hi"}, {"value": "Hello"}]}]))
    with pytest.raises(ValueError, match="none of the dataset's 1 conversations fits"):
        wl.sharegpt_workload(tok, path, 10)


def test_sweep_plot_writes_a_png(tmp_path):
    def point(rate, tput, ttft, tpot):
        return {"request_rate": rate, "output_throughput": tput,
                "ttft_ms": {"p99": ttft}, "tpot_ms": {"p99": tpot}}  # fmt: skip

    pts = [point(1, 10, 100, 50), point(2, 19, 150, 60), point(4, 30, 900, 130)]
    a = analyze(pts, 1000, 100)
    out = plot_sweep(pts, a, tmp_path / "sweep.png", 1000, 100)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
