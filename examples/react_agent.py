"""A ReAct-style tool loop: `select` chooses the next action (Python control flow reads
it), a Python calculator runs between gens, and its observation goes back to the model.
Every step extends the same conversation, so each request reuses the cached history.

    python examples/react_agent.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from _util import CacheMeter, backend_from_args

import radixlm as rl

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculator(expression: str) -> str:
    """Evaluate + - * / arithmetic (no names, no calls); an error message otherwise."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / are allowed")

    try:
        value = ev(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


SYSTEM = (
    "You solve arithmetic word problems step by step. At each step write a Thought, then "
    "choose an Action: 'calculate' (then give an Input expression such as 12 * 7) or "
    "'finish' (then give the Answer)."
)


@rl.function
def react(s, question, max_steps=3):
    s += rl.system(SYSTEM)
    s += rl.user(question)
    for step in range(max_steps):
        with s.assistant():
            s += "Thought:" + rl.gen(f"thought_{step}", max_tokens=24, stop="\n") + "\n"
            s += "Action: " + rl.select(f"action_{step}", choices=["calculate", "finish"])
            if s[f"action_{step}"] == "finish" or step == max_steps - 1:
                s += "\nAnswer:" + rl.gen("answer", max_tokens=12, stop="\n")
                return s["answer"].strip()
            s += "\nInput:" + rl.gen(f"input_{step}", max_tokens=16, stop="\n")
        s += rl.user("Observation: " + calculator(s[f"input_{step}"]))
    return None


def main(backend: Any) -> dict[str, Any]:
    meter = CacheMeter(backend)
    state = react.run(
        question="A box holds 12 eggs. How many eggs are in 7 boxes?",
        backend=backend,
        temperature=0,
    )
    print(state.text())
    print("answer:", state.ret_value)
    return {"answer": state.ret_value, "text": state.text(), "cache": meter.report()}


if __name__ == "__main__":
    main(backend_from_args(__doc__))
