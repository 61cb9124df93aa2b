"""Few-shot question answering over a batch: `run_batch` caches the shared few-shot
prefix once, then every question only computes its own tokens.

    python examples/few_shot_qa.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from typing import Any

from _util import CacheMeter, backend_from_args

import radixlm as rl

EXAMPLES = (
    "Answer each question with a single word.\n\n"
    "Q: What is the capital of France?\nA: Paris\n\n"
    "Q: What color is the sky on a clear day?\nA: Blue\n\n"
    "Q: How many legs does a spider have?\nA: Eight\n\n"
    "Q: What is frozen water called?\nA: Ice\n\n"
)
QUESTIONS = [
    "What is the capital of Italy?",
    "What color is grass?",
    "What animal says moo?",
    "What is the opposite of hot?",
    "What do bees make?",
    "What is the largest planet?",
    "What is the capital of Japan?",
    "How many days are in a week?",
]


@rl.function
def few_shot_qa(s, question):
    s += EXAMPLES
    s += "Q: " + question + "\nA:" + rl.gen("answer", max_tokens=6, stop="\n")


def main(backend: Any, questions: list[str] = QUESTIONS) -> dict[str, Any]:
    meter = CacheMeter(backend)
    states = few_shot_qa.run_batch(
        [{"question": q} for q in questions], backend=backend, temperature=0, progress_bar=True
    )
    answers = [s["answer"].strip() for s in states]
    for q, a in zip(questions, answers):
        print(f"{q} -> {a}")
    return {"answers": answers, "cache": meter.report()}


if __name__ == "__main__":
    main(backend_from_args(__doc__))
