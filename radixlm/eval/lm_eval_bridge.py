"""Scoring with lm-evaluation-harness (PyPI ``lm-eval``) instead of radixlm's own code:
the exact-match tasks (``generate_until``, first integer of the answer compared with the
harness's ``exact_match``) and the teacher-forced texts (``loglikelihood_rolling``: word
perplexity and bits per byte) are written as local task files, and ``lm_eval`` runs
them with its ``local-completions`` model against ``/v1/completions`` of a server: the
configuration's URL, or a ``radixlm serve`` this module starts with the configuration's
flags (one at a time, after the in-process evaluation has closed its engine).

lm-eval is optional: it runs in the interpreter given by ``--lm-eval-python`` (e.g. a
virtual environment under /work/peers) or in this one when it imports ``lm_eval``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from radixlm.eval.configs import EvalConfig
from radixlm.eval.tasks import Task

#: Seconds a started `radixlm serve` may take to answer /health.
SERVER_START_S = 600.0


@dataclass(frozen=True)
class LmEvalPlan:
    """Where lm-eval runs: the python executable that imports ``lm_eval``."""

    python: str


def _imports_lm_eval(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import lm_eval"], capture_output=True).returncode == 0
    except OSError:  # no such interpreter
        return False


def plan(mode: str, python: str | None) -> LmEvalPlan | str:
    """The interpreter to run lm-eval with, or the reason it will not run (a str).

    Raises:
        ValueError: mode "on" without an interpreter that imports ``lm_eval``.
    """
    if mode == "off":
        return "off (--lm-eval off)"
    exe = python or sys.executable
    if _imports_lm_eval(exe):
        return LmEvalPlan(python=exe)
    reason = f"lm_eval is not importable by {exe} (pip install lm-eval, or --lm-eval-python)"
    if mode == "on":
        raise ValueError(f"--lm-eval on: {reason}")
    return f"skipped: {reason}"


def _yaml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML flow scalar


def write_tasks(tasks: list[Task], folder: Path, max_gen_toks: int) -> list[str]:
    """Write lm-eval task files (YAML + JSONL) for the exact and teacher tasks into
    `folder`; return the task names (``radixlm_<task>``)."""
    names = []
    for task in tasks:
        if task.kind not in ("exact", "teacher"):
            continue
        name = "radixlm_" + "".join(c if c.isalnum() else "_" for c in task.name)
        data = folder / f"{name}.jsonl"
        rows = [{"prompt": it.prompt, "answer": it.answer or ""} for it in task.items]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        head = [
            f"task: {name}",
            "dataset_path: json",
            "dataset_kwargs:",
            "  data_files:",
            f"    test: {_yaml_str(str(data))}",
            "test_split: test",
        ]
        if task.kind == "exact":
            body = [
                "output_type: generate_until",
                'doc_to_text: "{{prompt}}"',
                'doc_to_target: "{{answer}}"',
                "generation_kwargs:",
                '  until: ["\\n"]',
                f"  max_gen_toks: {max_gen_toks}",
                "  do_sample: false",
                "  temperature: 0.0",
                "filter_list:",
                "  - name: first_int",
                "    filter:",
                "      - function: regex",
                '        regex_pattern: "(-?\\\\d+)"',
                "      - function: take_first",
                "metric_list:",
                "  - metric: exact_match",
                "    aggregation: mean",
                "    higher_is_better: true",
            ]
        else:
            body = [
                "output_type: loglikelihood_rolling",
                'doc_to_text: ""',
                'doc_to_target: "{{prompt}}"',
                "metric_list:",
                "  - metric: word_perplexity",
                "  - metric: bits_per_byte",
            ]
        (folder / f"{name}.yaml").write_text("\n".join(head + body) + "\n")
        names.append(name)
    return names


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(config: EvalConfig) -> Iterator[str]:
    """The base URL of `config`: its own, or that of a `radixlm serve` started with its
    flags and stopped on exit. Raises RuntimeError when the server does not come up."""
    if config.url:
        yield config.url
        return
    port = _free_port()
    cmd = [sys.executable, "-m", "radixlm", "serve", *shlex.split(config.flags)]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"radixlm serve exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"radixlm serve did not answer within {SERVER_START_S} s")
            time.sleep(1.0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _metrics(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """lm-eval's numeric per-task metrics without their stderr, keyed ``metric`` or
    ``metric/filter`` (lm-eval's ``metric,filter`` keys; the filter ``none`` dropped)."""
    out = {}
    for task, values in results.get("results", {}).items():
        out[task.removeprefix("radixlm_")] = {
            k.removesuffix(",none").replace(",", "/"): v
            for k, v in values.items()
            if "_stderr" not in k and isinstance(v, int | float) and not isinstance(v, bool)
        }
    return out


def run_one(lm: LmEvalPlan, url: str, folder: Path, names: list[str], tokenizer: str) -> dict:
    """Run lm-eval's tasks `names` (files in `folder`) against `url`; its metrics per task.
    Raises RuntimeError with lm-eval's last output lines when it fails."""
    from radixlm.bench.preflight import load_local_tokenizer

    tok_dir = folder / "tokenizer"
    if not tok_dir.exists():
        load_local_tokenizer(tokenizer).save_pretrained(tok_dir)
    out = folder / "out"
    served_name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    model_args = ",".join(
        [
            f"model={served_name}",
            f"base_url={url}/v1/completions",
            f"tokenizer={tok_dir}",
            "tokenizer_backend=huggingface",
            "num_concurrent=1",
            "max_retries=1",
        ]
    )
    cmd = [lm.python, "-m", "lm_eval", "--model", "local-completions"]
    cmd += ["--model_args", model_args, "--tasks", ",".join(names)]
    cmd += ["--include_path", str(folder), "--output_path", str(out), "--batch_size", "1"]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"lm_eval exited with {proc.returncode}: {tail}")
    files = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError("lm_eval wrote no results file")
    metrics = _metrics(json.loads(files[-1].read_text()))
    for f in files:
        f.unlink()
    return metrics


def run_all(
    lm: LmEvalPlan | str,
    configs: list[EvalConfig],
    tasks: list[Task],
    tokenizer: str,
    max_gen_toks: int = 8,
) -> dict[str, Any]:
    """lm-eval's metrics per configuration name, or ``{"ran": False, "reason": ...}``;
    a configuration whose server or lm-eval run fails gets ``{"error": ...}``."""
    if isinstance(lm, str):
        return {"ran": False, "reason": lm}
    with tempfile.TemporaryDirectory(prefix="radixlm-lmeval-") as tmp:
        folder = Path(tmp)
        names = write_tasks(tasks, folder, max_gen_toks)
        if not names:
            return {"ran": False, "reason": "no exact-match or teacher task"}
        per_config: dict[str, Any] = {}
        for config in configs:
            try:
                with served(config) as url:
                    per_config[config.name] = run_one(lm, url, folder, names, tokenizer)
            except (RuntimeError, OSError, ValueError, httpx.HTTPError, KeyError) as e:
                per_config[config.name] = {"error": str(e)}
    return {"ran": True, "python": lm.python, "configs": per_config}


def describe(result: dict[str, Any]) -> str:
    """Lines for the terminal: lm-eval's metrics per configuration, or why it did not run."""
    if not result.get("ran"):
        return f"lm-eval: {result.get('reason')}"
    lines = ["lm-eval (local-completions against radixlm serve):"]
    for name, tasks in result["configs"].items():
        if "error" in tasks:
            lines.append(f"  {name}: error: {tasks['error']}")
            continue
        for task, values in tasks.items():
            cells = ", ".join(f"{k}={v:.4g}" for k, v in sorted(values.items()))
            lines.append(f"  {name} {task}: {cells}")
    return "\n".join(lines)
