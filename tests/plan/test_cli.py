"""The `plan` CLI: subprocess runs of `python -m radixlm.plan`, JSON output, and the
`register(subparsers)` contract with the top-level `radixlm` command."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from radixlm.plan.cli import main, register


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "radixlm.plan", *argv], capture_output=True, text=True, timeout=60
    )


def test_kv_json_subprocess():
    proc = _run("kv", "--model", "Llama-3-70B", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["bytes_per_token"] == 327_680
    assert data["attention"] == "gqa"


def test_capacity_table_subprocess():
    proc = _run("capacity", "--model", "Qwen2.5-7B", "--gpu", "L40S")
    assert proc.returncode == 0, proc.stderr
    assert "replicated 2x" in proc.stdout
    assert "tokens if no repl." in proc.stdout


def test_bad_model_exit_code():
    proc = _run("kv", "--model", "definitely-not-a-model")
    assert proc.returncode == 2
    assert "error" in proc.stderr and proc.stdout == ""


def _json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "argv",
    [
        ["roofline", "--model", "Llama-3-8B", "--gpu", "H100"],
        ["spec", "--model", "Llama-3-8B", "--gpu", "H200", "--acceptance", "0.8"],
        ["chunk", "--model", "Llama-3-8B", "--gpu", "A100"],
        ["disagg", "--model", "Llama-3-70B", "--gpu", "H100", "--tp", "4"],
        ["fleet", "--model", "Llama-3-70B", "--gpu", "H100", "--rate", "10000"],
        ["moe", "--model", "DeepSeek-V3"],
        ["kv", "--model", "DeepSeek-V3", "--compare", "Llama-3-70B"],
        ["capacity", "--model", "Mixtral-8x7B", "--gpu", "B200", "--dtype", "fp8"],
    ],
)
def test_every_subcommand_text_and_json(capsys, argv):
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"plan {argv[0]}")
    data = _json(capsys, *argv, "--json")
    assert data["command"] == f"plan {argv[0]}"


def test_fleet_json_has_chain(capsys):
    data = _json(capsys, "fleet", "--model", "Llama-3-70B", "--gpu", "H100", "--json")
    best = data["best"]
    assert best["gpus"] == best["replicas"] * best["tp"]
    assert any(step["step"] == "replicas" for step in best["chain"])


def test_cpu_measured_roofline(capsys):
    data = _json(
        capsys,
        "roofline",
        "--model",
        "Llama-3-8B",
        "--gpu",
        "cpu",
        "--batches",
        "1",
        "--prompts",
        "64",
        "--json",
    )
    assert data["gpu"] == "cpu" and data["mem_bandwidth"] > 0
    assert data["decode"][0]["bound"] == "memory"


def test_register_contract():
    parser = argparse.ArgumentParser(prog="radixlm")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["plan", "kv", "--model", "Llama-3-8B", "--json"])
    assert callable(args.func)
    for name in ("kv", "capacity", "roofline", "spec", "chunk", "disagg", "fleet", "moe"):
        ns = parser.parse_args(["plan", name, "--model", "Llama-3-8B"])
        assert callable(ns.func)


def test_plan_without_subcommand_prints_help(capsys):
    parser = argparse.ArgumentParser(prog="radixlm")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan"])
    assert args.func(args) == 2
    assert "SUBCOMMAND" in capsys.readouterr().out


def test_roofline_plot_flag(tmp_path, capsys):
    out = tmp_path / "roof.png"
    data = _json(capsys, "roofline", "--model", "Llama-3-8B", "--plot", str(out), "--json")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plot" not in data
    else:
        assert out.is_file() and data["plot"] == str(out)
