"""Tree-of-thought style branching: `fork(3)` explores three approaches from one cached
prefix, `join()` gathers them, and a `select` judges which is best.

    python examples/tree_of_thought.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from typing import Any

from _util import CacheMeter, backend_from_args

import radixlm as rl

STYLES = ["practical", "creative", "cheap"]


@rl.function
def tree_of_thought(s, problem):
    s += rl.system("You are a thoughtful planner. Answer in one sentence.")
    s += rl.user(problem)
    branches = s.fork(len(STYLES))
    branches += lambda i: rl.assistant(
        f"A {STYLES[i]} plan:" + rl.gen("plan", max_tokens=24, stop="\n")
    )
    branches.join()  # s["plan"] is now the list of the three plans
    listing = "\n".join(f"{i + 1}. {p.strip()}" for i, p in enumerate(s["plan"]))
    s += rl.user(f"Here are three plans:\n{listing}\nWhich plan is best?")
    s += rl.assistant("The best plan is number " + rl.select("best", choices=["1", "2", "3"]))


def main(backend: Any) -> dict[str, Any]:
    meter = CacheMeter(backend)
    state = tree_of_thought.run(
        problem="How can I keep my houseplants alive while I travel for two weeks?",
        backend=backend,
        temperature=0,
    )
    for style, plan in zip(STYLES, state["plan"]):
        print(f"{style}: {plan.strip()}")
    print("best:", state["best"])
    return {"plans": state["plan"], "best": state["best"], "cache": meter.report()}


if __name__ == "__main__":
    main(backend_from_args(__doc__))
