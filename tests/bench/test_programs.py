"""benchmarks/programs: every workload runs to completion on the bundled model through the
in-process Engine with its program semantics intact, the checks catch broken runs, and
the runner's statistics (percentiles, paired ratio medians) are right on hand-made
numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "programs"))
import data  # noqa: E402
import workloads  # noqa: E402
from harness import MeteredBackend, parse_args, run_workload  # noqa: E402
from summary import paired_ratio, percentile, run_figures, summarize  # noqa: E402

from radixlm.lang.backend.openai import constraint_body  # noqa: E402

# name -> (gens, selects, completion tokens of the gens) of the one tiny program each
# runs: react with 3 turns, multi-turn with 4 messages, everything else as generated.
EXPECTED = {
    "few-shot": (1, 0, workloads.FEW_SHOT_TOKENS),
    "react": (3 * 2 + 1, 3, 3 * (24 + 8) + 16),
    "tree-of-thought": (2 * 3 + 1, 2, 2 * 3 * 24 + 32),
    "skeleton-of-thought": (1 + 3, 0, 32 + 3 * 48),
    "llm-judge": (4 + 1, 4, 4 * 32 + 16),
    "json": (1, 0, None),  # ends where the schema's grammar does
    "multi-turn": (4, 0, 4 * 32),
}


def tiny_inputs(name: str) -> list[dict]:
    args = workloads.WORKLOADS[name].inputs(1, 7)[0]
    if name == "react":
        args["turns"] = 3
    if name == "multi-turn":
        args["messages"] = args["messages"][:4]
    return [args]


@pytest.fixture(scope="module")
def backend():
    import radixlm
    from radixlm.lang.backend.engine import EngineBackend

    engine = radixlm.Engine(model="smollm2-135m", num_threads=2, max_total_tokens=8192)
    try:
        yield MeteredBackend(EngineBackend(engine))
    finally:
        engine.shutdown()


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_workload_runs_with_its_semantics(backend, name):
    inputs = tiny_inputs(name)
    result = run_workload(backend, name, inputs)
    assert result["failures"] == []  # ran to completion and passed the workload's check
    gens, selects, tokens = EXPECTED[name]
    assert (result["gens"], result["selects"]) == (gens, selects)
    if tokens is not None:  # EOS ignored: every free-text gen yields its max_tokens
        assert result["completion_tokens"] == tokens
    assert result["programs"] == 1 and result["texts"][0]
    if name == "json":
        record = json.loads(result["texts"][0].rsplit("<|im_start|>assistant\n", 1)[1][:-11])
        workloads.validate_person(record)


def test_checks_reject_broken_runs():
    with pytest.raises(AssertionError):
        workloads.validate_person({"name": "Ana", "age": 200, "city": "Oslo", "job": "chef",
                                   "employed": True})  # fmt: skip
    with pytest.raises(AssertionError):
        workloads.validate_person({"name": "Ana", "age": 30, "city": "Oslo", "job": "king",
                                   "employed": True})  # fmt: skip
    workloads.validate_person({"name": "Ana", "age": 30, "city": "Oslo", "job": "chef",
                               "employed": False})  # fmt: skip


def test_inputs_are_seeded_and_sized():
    assert data.multi_turn(3, 5) == data.multi_turn(3, 5) != data.multi_turn(3, 6)
    assert all(4 <= len(a["messages"]) <= 8 for a in data.multi_turn(20, 0))
    assert all(3 <= a["turns"] <= 5 for a in data.react(20, 0))
    shots = data.few_shot(4, 0)
    assert shots[0]["prefix"] == shots[2]["prefix"] != shots[1]["prefix"]  # two subjects
    assert shots[0]["prefix"].count("Answer: ") == 5
    # tool observations depend on episode, turn and action only
    assert data.tool_result(3, 1, "search", "x") == data.tool_result(3, 1, "search", "y")
    assert data.tool_result(3, 1, "search", "x") != data.tool_result(3, 2, "search", "x")


def test_percentile_and_paired_ratio():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) == pytest.approx(4.96)
    assert percentile([], 50) is None
    # per repetition 2.0, 1.0, 4.0 -> median 2.0 (the ratio of medians would be 4/3)
    assert paired_ratio([4.0, 3.0, 8.0], [2.0, 3.0, 2.0]) == 2.0
    # a repetition where either engine did not run is left out
    assert paired_ratio([4.0, None, 6.0], [2.0, 1.0, None]) == 2.0
    assert paired_ratio([None], [1.0]) is None


def test_run_figures_and_summary():
    w = {"programs": 4, "wall_s": 2.0, "latency_s": [1.0, 2.0, 1.5, 0.5],
         "prompt_tokens": 400, "completion_tokens": 100, "cached_tokens": 300,
         "failures": ["program 2: ServerError: down"],
         "texts": ["a", "b", None, "d"]}  # fmt: skip
    f = run_figures(w, ["a", "x", None, "d"])
    assert f["failures"] == 1 and f["failure_messages"] == ["program 2: ServerError: down"]
    assert f["programs_per_s"] == 2.0 and f["output_tps"] == 50.0
    assert f["latency_p50_s"] == 1.25 and f["cache_hit_rate"] == 0.75
    assert f["same_text_as_reference"] == 0.5  # a and d; a failed program never matches
    assert run_figures(dict(w, cached_tokens=None), None)["cache_hit_rate"] is None
    runs = [dict(f, programs_per_s=p) for p in (3.0, 1.0, 2.0)]
    s = summarize([runs[0], None, runs[1], runs[2]])
    assert (s["programs_per_s"], s["programs_per_s_min"], s["programs_per_s_max"]) == (
        2.0,
        1.0,
        3.0,
    )
    assert s["reps"] == 3 and summarize([None]) == {}


def test_harness_refuses_missing_server_or_model(capsys):
    for argv, missing in (
        (["--backend", "endpoint", "--out", "x.json"], "needs --url"),
        (["--backend", "openai", "--model-dir", "m", "--out", "x.json"], "needs --url"),
        (["--backend", "engine", "--out", "x.json"], "needs --model-dir"),
    ):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2 and missing in capsys.readouterr().err
    args = parse_args(["--backend", "endpoint", "--url", "http://h:1", "--out", "x.json"])
    assert args.url == "http://h:1" and args.speculative == "none"


def test_targets_and_table_ratio_columns():
    from run import ENGINES, PEER_KEYS, _targets
    from summary import markdown_table

    # every peer row has both references, of its own kind (in-process or HTTP)
    kinds = {e.key: e.backend for e in ENGINES}
    for e in ENGINES:
        if e.key in PEER_KEYS:
            want = {"engine"} if e.backend == "openvino" else {"endpoint"}
            assert {kinds[e.reference], kinds[e.ngram_reference]} == want, e.key
    t = _targets({"vllm": 2.0, "openvino": 1.1, "openvino-lookup": 1.3, "llama-server": None})
    assert t["vllm"] == 2.0 and t["met_vllm_1.5x"] is True
    assert (t["best_peer"], t["best_peer_ratio"], t["met_best_peer_1.2x"]) == (
        "openvino",
        1.1,
        False,
    )
    assert _targets({"vllm": None})["met_vllm_1.5x"] is None
    row = {"programs_per_s": 1.0, "programs_per_s_min": 0.5, "programs_per_s_max": 2.0,
           "output_tps": 10.0, "latency_p50_s": 0.25, "latency_p99_s": 0.5,
           "cache_hit_rate": None, "failures": 0}  # fmt: skip
    table = {"json": {"radixlm": row, "vllm": row, "llama-server": {"status": "not installed"}}}
    md = markdown_table(table, ["radixlm", "vllm", "llama-server"], {"json": {"vllm": 2.5}},
                        {"json": {"radixlm": 1.5, "vllm": 3.0}}).splitlines()  # fmt: skip
    assert md[2] == (
        "| json | radixlm | 1.000 (0.500-2.000) | 10.0 | 250 / 500 | n/a | 0 |  | 1.50x |"
    )
    assert md[3].endswith("| 0 | 2.50x | 3.00x |")
    assert md[4] == "| json | llama-server | not installed | | | | | | |"


def test_openai_constraint_dialects():
    schema = json.dumps({"type": "object"})
    assert constraint_body("vllm", json_schema=schema) == {
        "structured_outputs": {"json": {"type": "object"}}
    }
    assert constraint_body("vllm", choices=["a", "b"]) == {
        "structured_outputs": {"choice": ["a", "b"]}
    }
    assert constraint_body("vllm", regex="[0-9]+") == {"structured_outputs": {"regex": "[0-9]+"}}
    assert constraint_body("llama.cpp", json_schema=schema) == {"json_schema": {"type": "object"}}
    assert constraint_body("llama.cpp", choices=["1", 'say "hi"']) == {
        "grammar": 'root ::= "1" | "say \\"hi\\""'
    }
    from radixlm.lang import UnsupportedByBackendError

    with pytest.raises(UnsupportedByBackendError):
        constraint_body("llama.cpp", regex="[0-9]+")
