"""`radixlm plan moe` from shape flags, from a config.json, and its bad-input errors."""

from __future__ import annotations

import json

import pytest

from radixlm.plan.cli import main


def _json(capsys, *argv: str) -> dict:
    assert main(["moe", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_shape_flags_give_distinct_experts_and_bytes(capsys):
    data = _json(
        capsys, "--num-experts", "8", "--top-k", "2", "--hidden", "512",
        "--moe-intermediate", "1024", "--layers", "4", "--batches", "1,4,64", "--dtype", "fp32",
    )  # fmt: skip
    assert (data["num_experts"], data["top_k"], data["layers"]) == (8, 2, 4)
    rows = data["experts_per_step"]
    assert [r["batch"] for r in rows] == [1, 4, 64]
    assert rows[1]["distinct_experts"] == pytest.approx(5.46875)  # 8 (1 - 0.75^4)
    assert rows[0]["moe_bytes"] == 50_331_648  # 4 layers x 2 experts x 3 x 512 x 1024 x 4 B
    assert rows[2]["dense_same_total_bytes"] == 201_326_592
    assert main(["moe", "--num-experts", "8", "--top-k", "2", "--hidden", "512",
                 "--moe-intermediate", "1024"]) == 0  # fmt: skip
    assert "dense same active" in capsys.readouterr().out


def test_config_json_model(tmp_path, capsys):
    config = {
        "model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 96,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 8,
        "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    data = _json(capsys, "--model", str(tmp_path), "--batches", "2", "--dtype", "fp32")
    (row,) = data["experts_per_step"]
    assert row["distinct_experts"] == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    expert, shared = 3 * 64 * 32 * 4, 3 * 64 * 48 * 4
    assert row["moe_bytes"] == pytest.approx(3 * (3.5 * expert + shared))
    assert row["dense_same_active_bytes"] == 3 * (2 * expert + shared)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--top-k", "2"], "missing --num-experts, --hidden, --moe-intermediate"),
        (["--model", "Mixtral-8x7B", "--layers", "2"], "--model excludes --layers"),
        (["--num-experts", "4", "--top-k", "8", "--hidden", "8", "--moe-intermediate", "8"],
         "top_k"),
    ],
)  # fmt: skip
def test_bad_input_exits_2(argv, message, capsys):
    assert main(["moe", *argv]) == 2
    assert message in capsys.readouterr().err
