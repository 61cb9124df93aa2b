"""Offline, seeded inputs for the program workloads (no data set, no network).

Every generator takes (n, seed) and returns n argument dicts for its program; the same
(n, seed) gives the same dicts on every machine and in every interpreter (only
`random.Random` with an explicit seed is used). Texts are built from small word lists so
that their token counts are stable: the few-shot prefix is about 700 tokens, the
multi-turn system prompt about 600, the ReAct system prompt about 250.
"""

from __future__ import annotations

import random
from typing import Any

SUBJECTS = ("astronomy", "biology", "chemistry", "geography", "history", "physics")
NOUNS = (
    "river", "planet", "enzyme", "glacier", "empire", "crystal", "engine", "forest",
    "harbor", "comet", "protein", "volcano", "treaty", "magnet", "desert", "island",
    "castle", "signal", "bridge", "market", "orbit", "canyon", "battery", "library",
)  # fmt: skip
ADJECTIVES = (
    "ancient", "bright", "cold", "dense", "early", "frozen", "green", "heavy", "large",
    "narrow", "quiet", "rapid", "small", "steady", "tall", "warm", "wide", "young",
)  # fmt: skip
VERBS = (
    "absorbs", "builds", "carries", "changes", "controls", "crosses", "forms", "heats",
    "holds", "measures", "moves", "protects", "reflects", "supports", "traces", "warms",
)  # fmt: skip
CITIES = ("Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Quebec", "Tunis", "Perth", "Riga")
FIRST_NAMES = ("Ana", "Bruno", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana", "Ivo")
JOBS = ("engineer", "teacher", "farmer", "nurse", "pilot", "chef", "lawyer", "painter")
LETTERS = ("A", "B", "C", "D")


def _sentence(rng: random.Random, words: int = 10) -> str:
    parts = []
    while len(parts) < words:
        parts += [rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(VERBS), "the"]
    return " ".join(parts[:words]).capitalize() + "."


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng, rng.randint(8, 14)) for _ in range(sentences))


def _mc_question(rng: random.Random, subject: str) -> dict[str, Any]:
    noun, adj = rng.choice(NOUNS), rng.choice(ADJECTIVES)
    question = f"In {subject}, which statement about the {adj} {noun} is correct?"
    options = [_sentence(rng, 7) for _ in LETTERS]
    return {"question": question, "options": options, "answer": rng.choice(LETTERS)}


def format_mc(q: dict[str, Any], with_answer: bool) -> str:
    """An MMLU-style question block: question, lettered options, 'Answer:' (+ letter)."""
    lines = [q["question"]] + [f"{L}. {o}" for L, o in zip(LETTERS, q["options"])]
    return "\n".join(lines) + "\nAnswer:" + (f" {q['answer']}\n\n" if with_answer else "")


def few_shot(n: int, seed: int) -> list[dict[str, Any]]:
    """n questions over two subjects, each with its subject's fixed 5-shot prefix."""
    rng = random.Random(seed)
    subjects = rng.sample(SUBJECTS, 2)
    shots = {s: "".join(format_mc(_mc_question(rng, s), True) for _ in range(5)) for s in subjects}
    out = []
    for i in range(n):
        s = subjects[i % 2]
        header = f"The following are multiple choice questions about {s}.\n\n"
        out.append(
            {"prefix": header + shots[s], "question": format_mc(_mc_question(rng, s), False)}
        )
    return out


TOOLS = ("search", "lookup", "calculate")


def tool_result(episode_seed: int, turn: int, action: str, argument: str) -> str:
    """The observation a tool returns: a deterministic function of the episode, the turn
    and the action (the model's argument text is echoed, not interpreted, so every engine
    gets the same observation for the same action)."""
    rng = random.Random(episode_seed * 1000 + turn * 10 + TOOLS.index(action))
    if action == "calculate":
        return f"Result: {rng.randint(2, 999)}"
    return f"{action} found: {_sentence(rng, 12)}"


def react(n: int, seed: int) -> list[dict[str, Any]]:
    """n ReAct episodes: a question and its planned number of tool turns (3 to 5)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        noun, city = rng.choice(NOUNS), rng.choice(CITIES)
        q = f"How far is the nearest {rng.choice(ADJECTIVES)} {noun} from {city}, in km?"
        out.append({"question": q, "turns": rng.randint(3, 5), "episode_seed": seed * 100 + i})
    return out


def problems(n: int, seed: int) -> list[dict[str, Any]]:
    """n open planning problems (tree-of-thought, skeleton-of-thought)."""
    rng = random.Random(seed)
    return [
        {
            "problem": f"How should a {rng.choice(ADJECTIVES)} town near a "
            f"{rng.choice(NOUNS)} prepare for a {rng.choice(ADJECTIVES)} winter? "
            + _sentence(rng, 12)
        }
        for _ in range(n)
    ]


JUDGE_DIMENSIONS = ("accuracy", "clarity", "completeness", "relevance")


def judge(n: int, seed: int) -> list[dict[str, Any]]:
    """n (question, answer) pairs for the LLM judge."""
    rng = random.Random(seed)
    return [
        {"question": _mc_question(rng, rng.choice(SUBJECTS))["question"],
         "answer": _paragraph(rng, 4)}
        for _ in range(n)
    ]  # fmt: skip


PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "job": {"type": "string", "enum": list(JOBS)},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "job", "employed"],
    "additionalProperties": False,
}


def json_records(n: int, seed: int) -> list[dict[str, Any]]:
    """n short biographies to extract a PERSON_SCHEMA record from."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name, city, job = rng.choice(FIRST_NAMES), rng.choice(CITIES), rng.choice(JOBS)
        age = rng.randint(19, 80)
        bio = (f"{name} is a {age}-year-old {job} who lives in {city}. "
               + _paragraph(rng, 2))  # fmt: skip
        out.append({"bio": bio})
    return out


def chat_system_prompt(seed: int) -> str:
    """The long shared system prompt of the multi-turn workload (about 600 tokens)."""
    rng = random.Random(seed)
    rules = "\n".join(f"{i + 1}. {_paragraph(rng, 2)}" for i in range(16))
    return "You are a support assistant for a travel company. Follow these rules:\n" + rules


def multi_turn(n: int, seed: int) -> list[dict[str, Any]]:
    """n chat sessions sharing one system prompt, each with 4 to 8 user messages."""
    rng = random.Random(seed)
    system = chat_system_prompt(seed)
    return [
        {"system": system,
         "messages": [_paragraph(rng, 2) for _ in range(rng.randint(4, 8))]}
        for _ in range(n)
    ]  # fmt: skip
