"""`radixlm --help` and every subcommand's help render (argparse formats help strings with
%-interpolation, so a stray '%' in a flag's help only breaks when someone asks for it)."""

from __future__ import annotations

import argparse

import pytest

from radixlm.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_top_level_help_lists_every_subcommand():
    text = build_parser().format_help()
    for name in ("serve", "generate", "bench", "plan", "train-eagle"):
        assert name in text


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_subcommand_help_renders(name):
    text = _subcommands()[name].format_help()
    assert text.startswith("usage: ") and len(text) > 200
    if name in ("serve", "generate"):
        assert "--attention-backend" in text and "--cpu-gemm" in text
    http_only = ("--host", "--port", "--api-key", "--served-model-name")
    if name == "serve":
        assert all(flag in text for flag in http_only)
    if name == "generate":  # the server's own flags would do nothing there
        assert not any(flag in text for flag in http_only)


def test_plan_kv_help_names_no_gpu_flag_it_lacks():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "radixlm", "plan", "kv", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "--dtype" in out and "--gpu" not in out


@pytest.mark.parametrize(
    "argv,mixed,no_cache",
    [([], True, False), (["--no-enable-mixed-chunk"], False, False),
     (["--enable-mixed-chunk", "--disable-radix-cache"], True, True)],
)  # fmt: skip
def test_bool_flags_turn_on_and_off(argv, mixed, no_cache):
    # A switch that defaults on (mixed chunks) has a --no- form; one that defaults off
    # (the radix cache's) is a plain flag.
    from radixlm.config import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    assert (args.enable_mixed_chunk, args.disable_radix_cache) == (mixed, no_cache)
    with pytest.raises(SystemExit):
        parser.parse_args(["--no-disable-radix-cache"])
