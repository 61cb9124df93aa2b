"""`radixlm eval` end to end on a tiny random Llama (in-process engines): a configuration
compared with itself agrees exactly, a float16 KV cache differs from float32 by a small
KL, and bad input exits 2 before any engine loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import LlamaConfig

from radixlm.cli import main
from radixlm.runtime import local_hf_dir
from tests.tiny_models import TINY_SHAPE, save_random_model

GEN = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny_llama")
    config = LlamaConfig(**{**TINY_SHAPE, "max_position_embeddings": 1024})
    save_random_model(config, path, local_hf_dir("smollm2-135m"))
    return path


def _flags(tiny: Path, extra: str = "") -> str:
    return f"--model {tiny} --max-total-tokens 2048 {extra}".strip()


def test_self_agreement_and_fp16_kv(tiny, tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--baseline", _flags(tiny),
            "--candidate", f"same={_flags(tiny)}",
            "--candidate", f"f16kv={_flags(tiny, '--kv-cache-dtype float16')}",
            "--num-prompts", "2",
            "--gen-len", str(GEN),
            "--kv-short-tokens", "64",
            "--kv-long-tokens", "200",
            "--json-max-tokens", "8",
            "--lm-eval", "off",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["metric", "baseline", "same", "f16kv"]
    doc = json.loads(out.read_text())
    base, same, f16 = doc["configs"]
    assert (
        base["vs_baseline"] is None and base["kv_bytes_per_token"] == 2 * f16["kv_bytes_per_token"]
    )
    s = same["vs_baseline"]["summary"]
    assert s["greedy.agreement"] == 1.0
    assert s["greedy.first_divergence_median"] == GEN
    assert s["teacher.kl_mean"] == 0.0 and s["teacher.top1_agreement"] == 1.0
    assert all(r["first_divergence"] == GEN for r in same["vs_baseline"]["per_prompt"]["greedy"])
    assert same["scores"] == base["scores"]
    kl = f16["vs_baseline"]["summary"]["teacher.kl_mean"]
    assert 0.0 < kl < 1e-3  # fp16 rounding of K/V moves the logits a little
    assert f16["scores"]["teacher.perplexity"] == pytest.approx(
        base["scores"]["teacher.perplexity"], rel=1e-2
    )


def test_failing_candidate_is_reported(tiny, tmp_path, capsys):
    rc = main(
        [
            "eval",
            "--baseline", _flags(tiny),
            "--candidate", f"gone=--model {tmp_path / 'missing'}",
            "--tasks", "arith",
            "--num-prompts", "1",
            "--lm-eval", "off",
        ]
    )  # fmt: skip
    assert rc == 1
    assert "gone: ModelNotFoundError" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tasks", "arith,nope"], "unknown task(s) ['nope']"),
        (["--candidate", "--kv-cache-dtype fp9"], "invalid choice: 'fp9'"),
        (["--task-file", "exact=/nonexistent/t.jsonl"], "cannot read task file"),
        (["--task-file", "nope=/tmp/t.jsonl"], "KIND=PATH"),
    ],
)
def test_bad_input_exits_2(extra, message, capsys):
    assert main(["eval", *extra]) == 2
    assert message in capsys.readouterr().err
