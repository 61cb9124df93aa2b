"""The evaluation tasks: prompts generated from a seed, or read from local JSONL files.

Kinds (`TaskItem.kind`) and what each item holds:

- ``greedy``: ``prompt``; generated greedily for `TaskSpec.gen_len` tokens, EOS ignored.
- ``teacher``: ``prompt`` (a text scored teacher-forced: per-position logprobs, no
  generation); gives next-token KL, top-1 agreement and perplexity.
- ``exact``: ``prompt`` and ``answer``; a short greedy completion whose first line's first
  integer (or, for a non-numeric answer, its stripped first line) must equal the answer.
- ``json``: ``prompt`` and ``schema``; generated once constrained by the schema (the
  engine's json_schema grammar) and once unconstrained, then checked against the schema.

Generated tasks (`generate_tasks`), by name: ``greedy``, ``teacher``, ``arith`` (few-shot
"a + b = c" lines, exact), ``kv-short`` and ``kv-long`` (lists of ``key: value`` lines of
about `TaskSpec.kv_short_tokens` / `kv_long_tokens` tokens that end by asking for one
key, exact: what KV cache precision affects most), ``json``. A local file
(`read_task_file`) holds one JSON object per line with the fields of its kind.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("greedy", "teacher", "exact", "json")
TASKS = {
    "greedy": "greedy",
    "teacher": "teacher",
    "arith": "exact",
    "kv-short": "exact",
    "kv-long": "exact",
    "json": "json",
}

#: Openings for the greedy generations: varied registers so that divergence is not
#: measured on one kind of text only.
_OPENINGS = (
    "The history of the printing press begins",
    'def merge_sorted(a, b):\n    """Merge two sorted lists."""\n',
    "Dear hiring manager,\n\nI am writing to apply for",
    "Photosynthesis is the process by which",
    "Here is a recipe for a simple tomato soup.\n\nIngredients:\n",
    "The three laws of thermodynamics state that",
    "Once upon a time, in a village at the edge of a forest,",
    "To install the package, first make sure that",
)

#: Reference text for the teacher-forced metrics (KL, top-1, perplexity): plain
#: expository prose written for this module.
REFERENCE_TEXT = (
    "A lighthouse is a tower built to guide ships at night and in poor weather. Its lamp "
    "sits at the top, behind a large lens that gathers the light into a narrow beam. The "
    "beam turns slowly, so that sailors far away see a flash at regular intervals. Each "
    "lighthouse has its own pattern of flashes, and charts list these patterns, which lets "
    "a navigator tell one coast from another. Before electric lamps, keepers burned oil and "
    "had to trim the wicks through the night. They also kept logs of the weather, cleaned "
    "the glass, and rang a bell or sounded a horn when fog hid the light. Today most "
    "lighthouses run on their own, powered by the grid or by solar panels, and a small "
    "team visits them a few times a year. Many old towers have become museums, where "
    "visitors climb the spiral stairs and look out over the sea. The first lighthouses "
    "were simple fires on hills. The most famous of the ancient ones stood at Alexandria "
    "and was counted among the wonders of the world. Modern ones also carry radio beacons, "
    "yet the lamp remains, because a light is easy to see and needs no special receiver."
)

_SCHEMA_FIELDS = (
    ("name", {"type": "string"}, "a person's name"),
    ("age", {"type": "integer"}, "an age in years"),
    ("city", {"type": "string"}, "a city"),
    ("height_m", {"type": "number"}, "a height in metres"),
    ("is_student", {"type": "boolean"}, "whether they study"),
    ("email", {"type": "string"}, "an e-mail address"),
)


@dataclass(frozen=True)
class TaskItem:
    """One prompt of a task; `answer` for exact-match items, `schema` for json items."""

    prompt: str
    answer: str | None = None
    schema: dict[str, Any] | None = None


@dataclass
class Task:
    """A named list of items of one kind (see the module doc)."""

    name: str
    kind: str
    items: list[TaskItem] = field(default_factory=list)


@dataclass(frozen=True)
class TaskSpec:
    """Sizes of the generated tasks. Units: tokens, except `n` (items per task)."""

    n: int = 8
    gen_len: int = 256
    kv_short_tokens: int = 256
    kv_long_tokens: int = 1500
    seed: int = 0


def _arith(rng: random.Random, n: int) -> list[TaskItem]:
    items = []
    for _ in range(n):
        shots = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(4)]
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        lines = [f"{x} + {y} = {x + y}" for x, y in shots] + [f"{a} + {b} ="]
        items.append(TaskItem(prompt="\n".join(lines), answer=str(a + b)))
    return items


def _kv(rng: random.Random, n: int, target_tokens: int, count_tokens) -> list[TaskItem]:
    """Lists of ``key-NNNN: VVVV`` lines of about `target_tokens` tokens (counted with
    `count_tokens`), then the asked key's line prefix: the answer is a copy from context."""
    items = []
    for _ in range(n):
        keys = rng.sample(range(1000, 10000), 9000)
        lines: list[str] = []
        header = "Here is a list of keys and their values.\n"
        for key in keys:
            lines.append(f"key-{key}: {rng.randint(1000, 9999)}")
            if len(lines) % 8 == 0 and count_tokens(header + "\n".join(lines)) >= target_tokens:
                break
        pick = lines[rng.randrange(len(lines))]
        key, value = pick.split(": ")
        body = header + "\n".join(lines) + "\n\nThe value of " + key + " is given above.\n"
        items.append(TaskItem(prompt=body + key + ":", answer=value))
    return items


def _json(rng: random.Random, n: int) -> list[TaskItem]:
    items = []
    for _ in range(n):
        chosen = rng.sample(_SCHEMA_FIELDS, rng.randint(2, 4))
        schema = {
            "type": "object",
            "properties": {k: t for k, t, _ in chosen},
            "required": [k for k, _, _ in chosen],
            "additionalProperties": False,
        }
        desc = ", ".join(f'"{k}" ({d})' for k, _, d in chosen)
        prompt = f"Write one JSON object with the keys {desc}, and nothing else.\nJSON: "
        items.append(TaskItem(prompt=prompt, schema=schema))
    return items


def generate_tasks(names: list[str], spec: TaskSpec, count_tokens) -> list[Task]:
    """The generated tasks `names` (keys of `TASKS`), deterministic in `spec.seed`;
    `count_tokens(text) -> int` sizes the key-value lists with the model's tokenizer.

    Raises:
        ValueError: an unknown task name (the message lists the known ones).
    """
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; known: {', '.join(TASKS)}")
    tasks = []
    for name in names:
        rng = random.Random(f"{spec.seed}:{name}")
        if name == "greedy":
            items = [TaskItem(prompt=_OPENINGS[i % len(_OPENINGS)]) for i in range(spec.n)]
        elif name == "teacher":
            items = [TaskItem(prompt=REFERENCE_TEXT)]
        elif name == "arith":
            items = _arith(rng, spec.n)
        elif name == "json":
            items = _json(rng, spec.n)
        else:
            size = spec.kv_short_tokens if name == "kv-short" else spec.kv_long_tokens
            items = _kv(rng, spec.n, size, count_tokens)
        tasks.append(Task(name=name, kind=TASKS[name], items=items))
    return tasks


def read_task_file(spec: str) -> Task:
    """A local task from ``KIND=PATH`` (KIND one of `KINDS`): one JSON object per line
    with ``prompt`` (``text`` is accepted for teacher), and ``answer`` (exact) or
    ``schema`` (json). The task is named after the file's stem.

    Raises:
        ValueError: no KIND=, an unknown kind, an unreadable file, a line that is not a
            JSON object or lacks its kind's fields (the message gives the line number).
    """
    kind, sep, path = spec.partition("=")
    if not sep or kind not in KINDS:
        raise ValueError(f"--task-file wants KIND=PATH with KIND one of {KINDS}, got {spec!r}")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read task file {path}: {e}") from None
    task = Task(name=Path(path).stem, kind=kind)
    need = {"exact": "answer", "json": "schema"}.get(kind)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON: {e}") from None
        prompt = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
        if not isinstance(prompt, str) or (need and need not in obj):
            fields = "prompt" + (f" and {need}" if need else "")
            raise ValueError(f"{path}:{i}: a {kind} item needs {fields}")
        answer = None if obj.get("answer") is None else str(obj["answer"])
        task.items.append(TaskItem(prompt=prompt, answer=answer, schema=obj.get("schema")))
    if not task.items:
        raise ValueError(f"task file {path} holds no items")
    return task
