"""The SGLang paper's workload kinds as radixlm programs (Zheng et al., "SGLang: Efficient
Execution of Structured Language Model Programs", NeurIPS 2024, section 6).

Every engine runs these same functions: radixlm through its own backends, the peers
through `radixlm.lang.OpenAI` in completion mode (the program text is the prompt, so the
prompts are the same strings everywhere) or an in-process adapter. Programs run greedy
with EOS ignored (`RUN_OPTIONS`), so every free-text gen produces exactly its max_tokens;
the JSON gen stops where its schema's grammar ends. Select and JSON go through whatever
the backend offers for them (see run.py's engine notes).

`WORKLOADS` maps a workload name to a `Workload`: the program, its input generator
(data.py), the program count at the default and the quick size, and `check`, which
raises AssertionError when a finished state breaks the program's semantics.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import data

import radixlm as rl

RUN_OPTIONS: dict[str, Any] = {"temperature": 0, "ignore_eos": True}

FEW_SHOT_TOKENS = 4
REACT_SYSTEM = (
    "You are an agent that answers questions about places by using tools. Tools:\n"
    "- search[query]: searches an encyclopedia and returns one sentence.\n"
    "- lookup[term]: looks a term up in the last page found and returns one sentence.\n"
    "- calculate[expression]: evaluates an arithmetic expression.\n"
    "At every step write a Thought, then an Action with its argument in brackets. You "
    "will get an Observation back. Continue until you can answer. Keep thoughts short "
    "and concrete, name the places you need, and prefer search before lookup. When you "
    "have enough facts, compute the distance with calculate and give the answer in km."
)
TOT_BRANCHES = 3
SOT_POINTS = 3


@rl.function
def few_shot(s, prefix, question):
    """MMLU-style 5-shot: a subject's fixed 5-example prefix, the question, its answer."""
    s += prefix + question
    s += rl.gen("answer", max_tokens=FEW_SHOT_TOKENS)


@rl.function
def react_agent(s, question, turns, episode_seed):
    """ReAct (Yao et al. 2023): `turns` rounds of thought, action (select over the
    tools), argument and a deterministic tool observation; then the answer."""
    s += rl.system(REACT_SYSTEM)
    s += rl.user(question)
    for t in range(turns):
        with s.assistant():
            s += "Thought:" + rl.gen(f"thought_{t}", max_tokens=24)
            s += "\nAction: " + rl.select(f"action_{t}", choices=list(data.TOOLS))
            s += "[" + rl.gen(f"arg_{t}", max_tokens=8) + "]"
        obs = data.tool_result(episode_seed, t, s[f"action_{t}"], s[f"arg_{t}"])
        s += rl.user("Observation: " + obs)
    s += rl.assistant("Answer:" + rl.gen("answer", max_tokens=16))


@rl.function
def tree_of_thought(s, problem, depth=2):
    """Tree of thought (Yao et al. 2023): at each level fork 3 ideas from the shared
    history, pick the best with a select, and continue from it."""
    s += rl.system("You are a careful planner. Think in short, concrete ideas.")
    s += rl.user(problem)
    for d in range(depth):
        branches = s.fork(TOT_BRANCHES)
        branches += lambda i, d=d: rl.assistant(
            f"Idea {i + 1}:" + rl.gen(f"idea_{d}", max_tokens=24)
        )
        branches.join()
        listing = "\n".join(f"{i + 1}. {x.strip()}" for i, x in enumerate(s[f"idea_{d}"]))
        s += rl.user(f"Ideas:\n{listing}\nWhich idea is best?")
        s += rl.assistant(
            "The best idea is number " + rl.select(f"best_{d}", choices=["1", "2", "3"])
        )
        s += rl.user("Develop that idea one step further.")
    s += rl.assistant("Final plan:" + rl.gen("final", max_tokens=32))


@rl.function
def skeleton_of_thought(s, problem):
    """Skeleton of thought (Ning et al. 2024): a short skeleton, then every point
    expanded in parallel forks of the same history, gathered in order."""
    s += rl.system("You are a helpful assistant. Answer with a skeleton, then details.")
    s += rl.user(f"{problem}\nFirst give a skeleton of {SOT_POINTS} short points.")
    s += rl.assistant("Skeleton:\n1." + rl.gen("skeleton", max_tokens=32))
    points = s.fork(SOT_POINTS)
    points += lambda i: rl.user(f"Expand point {i + 1} in two sentences.")
    points += rl.assistant(rl.gen("point", max_tokens=48))
    points.join()


@rl.function
def llm_judge(s, question, answer):
    """LLM judge: one branch per dimension scores the same answer (a short judgment,
    then a 1-5 score by select); the verdict follows."""
    s += rl.system("You are a strict grader of answers to exam questions.")
    s += rl.user(f"Question: {question}\nAnswer: {answer}")
    dims = s.fork(len(data.JUDGE_DIMENSIONS))
    dims += lambda i: rl.user(f"Judge the answer's {data.JUDGE_DIMENSIONS[i]} only.")
    dims += lambda i: rl.assistant(
        "Judgment:" + rl.gen("judgment", max_tokens=32) + "\nScore: "
        + rl.select("score", choices=["1", "2", "3", "4", "5"])
    )  # fmt: skip
    dims.join()
    scores = ", ".join(f"{d} {x}" for d, x in zip(data.JUDGE_DIMENSIONS, s["score"]))
    s += rl.user(f"Scores: {scores}. Give the final verdict.")
    s += rl.assistant("Verdict:" + rl.gen("verdict", max_tokens=16))


@rl.function
def json_decode(s, bio):
    """Constrained decoding: a PERSON_SCHEMA record extracted from a biography."""
    s += rl.system("You extract facts as JSON.")
    s += rl.user(f"{bio}\nGive this person's record as JSON.")
    s += rl.assistant(
        rl.gen("record", max_tokens=96, json_schema=data.PERSON_SCHEMA, ignore_eos=False)
    )


@rl.function
def multi_turn(s, system, messages):
    """Multi-turn chat: a long shared system prompt, then 4-8 user turns, each answered;
    every turn resends the whole history."""
    s += rl.system(system)
    for i, m in enumerate(messages):
        s += rl.user(m)
        s += rl.assistant(rl.gen(f"reply_{i}", max_tokens=32))


# ---- semantic checks (AssertionError on a broken program run) ---------------------------


def _check_few_shot(s, args) -> None:
    assert isinstance(s["answer"], str)


def _check_react(s, args) -> None:
    for t in range(args["turns"]):
        assert s[f"action_{t}"] in data.TOOLS, s[f"action_{t}"]
    assert f"action_{args['turns']}" not in s
    observations = [m for m in s.messages() if m["content"].startswith("Observation: ")]
    assert len(observations) == args["turns"]
    assert "answer" in s


def _check_tot(s, args) -> None:
    for d in range(2):
        assert len(s[f"idea_{d}"]) == TOT_BRANCHES
        assert s[f"best_{d}"] in ("1", "2", "3")
    assert "final" in s


def _check_sot(s, args) -> None:
    assert len(s["point"]) == SOT_POINTS and "skeleton" in s


def _check_judge(s, args) -> None:
    assert len(s["judgment"]) == len(data.JUDGE_DIMENSIONS)
    assert len(s["score"]) == len(data.JUDGE_DIMENSIONS)
    assert all(x in ("1", "2", "3", "4", "5") for x in s["score"])
    assert "verdict" in s


def _check_json(s, args) -> None:
    record = json.loads(s["record"])
    validate_person(record)


def validate_person(record: Any) -> None:
    """Raise AssertionError unless `record` satisfies data.PERSON_SCHEMA."""
    props = data.PERSON_SCHEMA["properties"]
    assert isinstance(record, dict) and set(record) == set(props), record
    assert isinstance(record["name"], str) and len(record["name"]) <= 24
    assert isinstance(record["city"], str) and len(record["city"]) <= 24
    age = record["age"]
    assert isinstance(age, int) and not isinstance(age, bool) and 0 <= age <= 120
    assert record["job"] in data.JOBS and isinstance(record["employed"], bool)


def _check_multi_turn(s, args) -> None:
    n = len(args["messages"])
    assert all(f"reply_{i}" in s for i in range(n)) and f"reply_{n}" not in s
    assert sum(m["role"] == "assistant" for m in s.messages()) == n


@dataclass(frozen=True)
class Workload:
    """program: the rl.function; inputs(n, seed): its argument dicts; n / quick_n:
    programs per run at the default / quick size; check(state, args): semantics."""

    program: Any
    inputs: Callable[[int, int], list[dict[str, Any]]]
    n: int
    quick_n: int
    check: Callable[[Any, dict[str, Any]], None]


WORKLOADS: dict[str, Workload] = {
    "few-shot": Workload(few_shot, data.few_shot, 16, 8, _check_few_shot),
    "react": Workload(react_agent, data.react, 4, 2, _check_react),
    "tree-of-thought": Workload(tree_of_thought, data.problems, 4, 2, _check_tot),
    "skeleton-of-thought": Workload(skeleton_of_thought, data.problems, 4, 2, _check_sot),
    "llm-judge": Workload(llm_judge, data.judge, 4, 2, _check_judge),
    "json": Workload(json_decode, data.json_records, 8, 4, _check_json),
    "multi-turn": Workload(multi_turn, data.multi_turn, 4, 2, _check_multi_turn),
}
