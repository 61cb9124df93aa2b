"""Bad input: one error line naming the flag and its allowed range, exit status 2; the
pure functions raise ValueError instead of dividing by zero or answering wrongly."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys

import pytest

from radixlm.plan import validate
from radixlm.plan.capacity import capacity, kv_budget_per_gpu, tokens_that_fit
from radixlm.plan.chunk import plan_chunk
from radixlm.plan.cli import build_parser, main
from radixlm.plan.cost import Deployment
from radixlm.plan.disagg import plan_disagg
from radixlm.plan.dtypes import weight_bytes_per_param
from radixlm.plan.fleet import plan_replica
from radixlm.plan.hardware import derate
from radixlm.plan.kv import kv_heads_per_gpu
from radixlm.plan.lengths import LengthDist
from radixlm.plan.spec import SpecModel, expected_tokens, leviathan_speedup

M = ("--model", "Llama-3-8B")

# (argv, flag, allowed range as the message states it)
BAD_FLAGS = [
    (["capacity", *M, "--page-size", "0"], "--page-size", "integer >= 1"),
    (["capacity", *M, "--page-size", "-3"], "--page-size", "integer >= 1"),
    (["capacity", *M, "--dtype", "int4", "--group-size", "0"], "--group-size", "integer >= 1"),
    (["capacity", *M, "--mem-fraction", "2"], "--mem-fraction", "in (0, 1]"),
    (["capacity", *M, "--mem-fraction", "-1"], "--mem-fraction", "in (0, 1]"),
    (["capacity", *M, "--kv-budget-bytes", "-1"], "--kv-budget-bytes", "integer >= 0"),
    (["capacity", *M, "--reserve-gib", "-1"], "--reserve-gib", "number >= 0"),
    (["capacity", *M, "--context", "0"], "--context", "integer >= 1"),
    (["kv", *M, "--context", "-5"], "--context", "integer >= 1"),
    (["kv", *M, "--tp", "0,2"], "--tp", "integers >= 1"),
    (["roofline", *M, "--flops-eff", "0"], "--flops-eff", "in (0, 1]"),
    (["roofline", *M, "--flops-eff", "nan"], "--flops-eff", "in (0, 1]"),
    (["roofline", *M, "--flops-eff", "inf"], "--flops-eff", "in (0, 1]"),
    (["roofline", *M, "--bw-eff", "0"], "--bw-eff", "in (0, 1]"),
    (["roofline", *M, "--bw-eff", "-1"], "--bw-eff", "in (0, 1]"),
    (["roofline", *M, "--tp", "0"], "--tp", "integer >= 1"),
    (["roofline", *M, "--tp", "-2"], "--tp", "integer >= 1"),
    (["roofline", *M, "--tp", "1.5"], "--tp", "integer >= 1"),
    (["roofline", *M, "--overhead-ms", "-1"], "--overhead-ms", "number >= 0"),
    (["roofline", *M, "--batches", "0,4"], "--batches", "integers >= 1"),
    (["roofline", *M, "--context", "-1"], "--context", "integer >= 0"),
    (["spec", *M, "--draft-cost", "-1"], "--draft-cost", "number >= 0"),
    (["spec", *M, "--draft-len", "-1"], "--draft-len", "integer >= 1"),
    (["spec", *M, "--draft-len", "0"], "--draft-len", "integer >= 1"),
    (["spec", *M, "--acceptance", "1.2"], "--acceptance", "in [0, 1]"),
    (["chunk", *M, "--prompt", "0"], "--prompt", "integer >= 1"),
    (["chunk", *M, "--align", "0"], "--align", "integer >= 1"),
    (["chunk", *M, "--tpot-ms", "0"], "--tpot-ms", "number > 0"),
    (["chunk", *M, "--ttft-ms", "-5"], "--ttft-ms", "number > 0"),
    (["chunk", *M, "--decode-batch", "-1"], "--decode-batch", "integer >= 0"),
    (["disagg", *M, "--link-gbps", "0"], "--link-gbps", "number > 0"),
    (["disagg", *M, "--output", "0"], "--output", "integer >= 1"),
    (["disagg", *M, "--link-latency-ms", "-1"], "--link-latency-ms", "number >= 0"),
    (["fleet", *M, "--utilization", "0"], "--utilization", "in (0, 1]"),
    (["fleet", *M, "--utilization", "1.5"], "--utilization", "in (0, 1]"),
    (["fleet", *M, "--rate", "-5"], "--rate", "number > 0"),
    (["fleet", *M, "--prefix-hit", "1.5"], "--prefix-hit", "in [0, 1]"),
    (["fleet", *M, "--gpus-per-node", "0"], "--gpus-per-node", "integer >= 1"),
    (["fleet", *M, "--prompt-len", "abc"], "--prompt-len", "integer lengths >= 1"),
    (["fleet", *M, "--output-len", "64:nan"], "--output-len", "finite weights >= 0"),
    (["moe", "--model", "Mixtral-8x7B", "--batches", "-1"], "--batches", "integers >= 1"),
]


def _exit_status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize(("argv", "flag", "allowed"), BAD_FLAGS)
def test_bad_flag_one_line_exit_2(capsys, argv, flag, allowed):
    assert _exit_status(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"radixlm plan {argv[0]}: error: argument {flag}: ")
    assert allowed in lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["capacity", *M, "--page-size", "0"],
        ["roofline", *M, "--flops-eff", "nan"],
        ["spec", *M, "--draft-cost", "-1"],
        ["fleet", *M, "--utilization", "0"],
    ],
)
def test_bad_flag_subprocess_no_traceback(argv):
    proc = subprocess.run(
        [sys.executable, "-m", "radixlm.plan", *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert argv[-2] in proc.stderr


def test_runtime_value_error_is_one_line(capsys):
    """A ValueError raised past argparse (here an unknown GPU) is one line, status 2."""
    assert main(["roofline", *M, "--gpu", "TPU-v9"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("radixlm plan roofline: error: unknown gpu 'TPU-v9'")


def test_edge_values_still_accepted(capsys):
    ok = [
        ["capacity", *M, "--mem-fraction", "1", "--kv-budget-bytes", "0", "--page-size", "1"],
        ["roofline", *M, "--flops-eff", "1", "--bw-eff", "0.5", "--tp", "3", "--context", "0"],
        ["spec", *M, "--acceptance", "1", "--draft-cost", "0", "--draft-len", "1"],
        ["chunk", *M, "--prompt", "1", "--align", "1", "--decode-batch", "0"],
        ["fleet", *M, "--utilization", "1", "--prefix-hit", "1", "--gpus-per-node", "1"],
        ["fleet", *M, "--prompt-len", "128:1,2048:0", "--output-len", "64"],
    ]
    for argv in ok:
        assert main([*argv, "--json"]) == 0, argv
        capsys.readouterr()


def test_chunk_infeasible_tpot_message_is_consistent(capsys):
    assert main(["chunk", *M, "--tpot-ms", "7.1"]) == 0
    out = capsys.readouterr().out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict"))
    assert "infeasible" in verdict
    step = float(verdict.split("1-token chunk, ")[1].split(" ms")[0])
    assert step > 7.1


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((name, a) for a in sub._actions if a.option_strings)


def test_every_flag_has_help_and_shows_default():
    plan = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["plan"]
    seen = 0
    for name, action in _options(plan):
        if action.dest == "help":
            continue
        seen += 1
        assert action.help, f"plan {name} {action.option_strings[0]} has no help"
    assert seen > 60
    for name in ("chunk", "fleet", "roofline", "disagg"):
        text = plan._subparsers._group_actions[0].choices[name].format_help()
        assert "(default: " in text
    text = plan._subparsers._group_actions[0].choices["chunk"].format_help()
    assert "(default: 50.0)" in text and "ms" in text
    fleet = plan._subparsers._group_actions[0].choices["fleet"].format_help()
    assert "(default: 1,2,4,8)" in fleet


# --- the pure functions raise ValueError naming the parameter ---------------------------


def test_range_describe_and_check():
    assert validate.FRACTION.describe() == "a number in (0, 1]"
    assert validate.POSITIVE_INT.describe() == "an integer >= 1"
    assert validate.FINITE.describe() == "a finite number"
    assert validate.PROBABILITY.check("p", 1.0) == 1.0
    for bad in (0, -1, math.nan, math.inf, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match=r"x must be a number in \(0, 1\]"):
            validate.FRACTION.check("x", bad)
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 2.0"):
        validate.POSITIVE_INT.check("n", 2.0)


def test_converters():
    assert validate.positive_int("3") == 3
    assert validate.fraction("0.25") == 0.25
    assert validate.int_list("1, 2,4") == [1, 2, 4]
    assert validate.length_dist("128:1,256:3") == "128:1,256:3"
    for conv, text in [
        (validate.positive_int, "0"),
        (validate.positive_int, "x"),
        (validate.non_negative_float, "-0.1"),
        (validate.positive_float, "nan"),
        (validate.probability, "inf"),
        (validate.int_list, ""),
        (validate.length_dist, "0"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match="must be|bad length"):
            conv(text)


@pytest.fixture
def dep(specs, h100):
    return Deployment(specs["Llama-3-8B"], h100)


def test_pure_functions_reject_bad_values(specs, h100, dep):
    m = specs["Llama-3-8B"]
    cases = [
        (lambda: weight_bytes_per_param("int4", 0), "group_size"),
        (lambda: tokens_that_fit(1e9, 1024, page_size=0), "page_size"),
        (lambda: kv_budget_per_gpu(h100, 1e9, tp=0), "tp"),
        (lambda: capacity(m, h100, mem_fraction=2.0), "mem_fraction"),
        (lambda: capacity(m, None, kv_budget_bytes=-1), "kv_budget_bytes"),
        (lambda: capacity(m, h100, context=-5), "context"),
        (lambda: kv_heads_per_gpu(m, 0), "tp"),
        (lambda: derate(h100, 0.0, 1.0), "flops_eff"),
        (lambda: derate(h100, 1.0, math.nan), "bw_eff"),
        (lambda: Deployment(m, h100, tp=0), "tp"),
        (lambda: Deployment(m, h100, overhead_s=-1), "overhead_s"),
        (lambda: dep.step(chunk=1, chunk_prefix=-1), "chunk_prefix"),
        (lambda: expected_tokens(1.5, 4), "acceptance"),
        (lambda: leviathan_speedup(0.7, 1, -1.0), "draft_cost"),
        (lambda: SpecModel(dep, 0.7, -1, 1024), "draft_len"),
        (lambda: LengthDist.parse("128:inf"), "bad length distribution"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"prompt": 0}, "prompt"), ({"align": 0}, "align"), ({"tpot_slo_ms": 0}, "tpot_slo_ms")],
)
def test_plan_chunk_rejects(dep, kwargs, name):
    args = dict(decode_batch=32, context=2048, prompt=4096, tpot_slo_ms=50, ttft_slo_ms=2000)
    with pytest.raises(ValueError, match=name):
        plan_chunk(dep, **{**args, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"output": 0}, "output"), ({"link_bandwidth": 0}, "link_bandwidth")],
)
def test_plan_disagg_rejects(dep, kwargs, name):
    args = dict(prompt=4096, output=256, link_bandwidth=50e9, tpot_slo_ms=50)
    with pytest.raises(ValueError, match=name):
        plan_disagg(dep, **{**args, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"utilization": 0}, "utilization"),
        ({"utilization": 1.5}, "utilization"),
        ({"rate": -5}, "rate"),
        ({"prefix_hit": 1.5}, "prefix_hit"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
    ],
)
def test_plan_replica_rejects(dep, kwargs, name):
    args = dict(
        rate=100.0,
        prompt=LengthDist.parse("1024"),
        output=LengthDist.parse("256"),
        ttft_slo_ms=2000,
        tpot_slo_ms=50,
    )
    with pytest.raises(ValueError, match=name):
        plan_replica(dep, **{**args, **kwargs})
