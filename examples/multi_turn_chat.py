"""A multi-turn chat: each turn resends the whole conversation, and the radix cache
serves everything but the newest message.

    python examples/multi_turn_chat.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from typing import Any

from _util import CacheMeter, backend_from_args

import radixlm as rl

TURNS = [
    "Hi! Can you suggest a name for a black cat?",
    "Nice. And one for a white dog?",
    "Which of the two names is shorter?",
]


@rl.function
def chat(s, turns):
    s += rl.system("You are a friendly assistant. Keep answers to one sentence.")
    for i, turn in enumerate(turns):
        s += rl.user(turn)
        s += rl.assistant(rl.gen(f"answer_{i}", max_tokens=24))


def main(backend: Any) -> dict[str, Any]:
    meter = CacheMeter(backend)
    state = chat.run(turns=TURNS, backend=backend, temperature=0)
    for message in state.messages():
        print(f"[{message['role']}] {message['content']}")
    return {"messages": state.messages(), "cache": meter.report()}


if __name__ == "__main__":
    main(backend_from_args(__doc__))
