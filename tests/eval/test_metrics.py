"""The scoring functions of `radixlm eval` on hand-computed values, and its task inputs."""

from __future__ import annotations

import json
import math

import pytest

from radixlm.eval import metrics as m
from radixlm.eval.configs import parse_config
from radixlm.eval.tasks import TASKS, TaskSpec, generate_tasks, read_task_file


def test_greedy_agreement_and_first_divergence():
    assert m.greedy_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (1.0, 4)
    assert m.greedy_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == (0.75, 2)
    assert m.greedy_agreement([1, 2, 3], [1]) == (1 / 3, 1)  # a short candidate disagrees


def test_topk_kl_is_the_coarsened_kl():
    ln = math.log
    base = [(ln(0.5), 1), (ln(0.3), 2)]  # tail bucket 0.2
    assert m.topk_kl(base, base) == 0.0
    swapped = [(ln(0.5), 2), (ln(0.3), 1)]
    want = 0.5 * ln(0.5 / 0.3) + 0.3 * ln(0.3 / 0.5)  # the tail buckets are equal
    assert m.topk_kl(base, swapped) == pytest.approx(want, rel=1e-12)
    # token 2 is missing from the candidate's top-k: it gets the k-th logprob, 0.2
    missing = [(ln(0.6), 3), (ln(0.2), 1)]
    want = 0.5 * ln(0.5 / 0.2) + 0.3 * ln(0.3 / 0.2) + 0.2 * ln(0.2 / 0.6)
    assert m.topk_kl(base, missing) == pytest.approx(want, rel=1e-12)


def test_exact_match_reads_the_first_line():
    assert m.exact_match(" 37\n12 + 3 = 15", "37")
    assert not m.exact_match(" 371", "37")
    assert not m.exact_match("\n", "37")
    assert m.exact_match(" Paris\nBerlin", "Paris")


def test_json_validity_of_known_outputs():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert m.json_valid('Sure: {"a": 1} done', schema)
    assert not m.json_valid('{"a": 1.5}', schema)
    assert not m.json_valid('{"a": ', schema)
    assert not m.json_valid("no json here", schema)


def test_perplexity():
    assert m.perplexity([math.log(0.5)] * 3) == pytest.approx(2.0)


def test_generated_tasks_are_seeded_and_answerable():
    count = len  # characters stand in for tokens
    a = generate_tasks(list(TASKS), TaskSpec(n=3, kv_long_tokens=600), count)
    b = generate_tasks(list(TASKS), TaskSpec(n=3, kv_long_tokens=600), count)
    assert [t.items for t in a] == [t.items for t in b]
    arith = next(t for t in a if t.name == "arith")
    for it in arith.items:
        x, y = it.prompt.rsplit("\n", 1)[1].rstrip(" =").split(" + ")
        assert int(it.answer) == int(x) + int(y)
    for it in next(t for t in a if t.name == "kv-long").items:
        key = it.prompt.rsplit("\n", 1)[1].rstrip(":")
        assert f"\n{key}: {it.answer}\n" in it.prompt and len(it.prompt) >= 600
    with pytest.raises(ValueError, match="unknown task"):
        generate_tasks(["nope"], TaskSpec(), count)


def test_task_files(tmp_path):
    good = tmp_path / "qa.jsonl"
    good.write_text(json.dumps({"prompt": "2 + 2 =", "answer": 4}) + "\n\n")
    task = read_task_file(f"exact={good}")
    assert (task.name, task.kind, task.items[0].answer) == ("qa", "exact", "4")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: a exact item needs prompt and answer"):
        read_task_file(f"exact={bad}")
    with pytest.raises(ValueError, match="cannot read task file"):
        read_task_file(f"greedy={tmp_path / 'missing.jsonl'}")
    with pytest.raises(ValueError, match="KIND=PATH"):
        read_task_file(str(good))


def test_configs_parse_like_serve_flags():
    c = parse_config("f16=--kv-cache-dtype float16 --max-total-tokens 2048", "x")
    assert (c.name, c.engine_args) == (
        "f16",
        {"kv_cache_dtype": "float16", "max_total_tokens": 2048},
    )
    assert parse_config("q=http://127.0.0.1:1/", "x").url == "http://127.0.0.1:1"
    with pytest.raises(ValueError, match="invalid choice: 'fp9'"):
        parse_config("--kv-cache-dtype fp9", "x")
    with pytest.raises(ValueError, match="page_size"):
        parse_config("--page-size 3", "x")


def test_lm_eval_task_files(tmp_path):
    import yaml

    from radixlm.eval.lm_eval_bridge import plan, write_tasks

    tasks = generate_tasks(["arith", "teacher", "json"], TaskSpec(n=2), len)
    names = write_tasks(tasks, tmp_path, max_gen_toks=8)
    assert names == ["radixlm_arith", "radixlm_teacher"]  # json has no lm-eval form here
    arith = yaml.safe_load((tmp_path / "radixlm_arith.yaml").read_text())
    assert arith["output_type"] == "generate_until"
    assert arith["generation_kwargs"]["until"] == ["\n"]
    assert arith["filter_list"][0]["filter"][0]["regex_pattern"] == r"(-?\d+)"
    rows = (tmp_path / "radixlm_arith.jsonl").read_text().splitlines()
    assert [json.loads(r)["answer"] for r in rows] == [it.answer for it in tasks[0].items]
    teacher = yaml.safe_load((tmp_path / "radixlm_teacher.yaml").read_text())
    assert teacher["output_type"] == "loglikelihood_rolling"
    with pytest.raises(ValueError, match="--lm-eval on: lm_eval is not importable"):
        plan("on", str(tmp_path / "no-python"))
    assert plan("off", None) == "off (--lm-eval off)"
