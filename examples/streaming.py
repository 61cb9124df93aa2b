"""Streaming: run a program with ``stream=True`` and print its answer as it is generated
(`text_iter`; `text_async_iter` is the asyncio form).

    python examples/streaming.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from typing import Any

from _util import CacheMeter, backend_from_args

import radixlm as rl


@rl.function
def story(s, topic):
    s += rl.system("You are a storyteller.")
    s += rl.user(f"Tell a two-sentence story about {topic}.")
    s += rl.assistant(rl.gen("story", max_tokens=48))


def main(backend: Any) -> dict[str, Any]:
    meter = CacheMeter(backend)
    state = story.run(topic="a lighthouse keeper", backend=backend, temperature=0, stream=True)
    pieces = []
    for piece in state.text_iter("story"):
        pieces.append(piece)
        print(piece, end="", flush=True)
    print()
    return {"pieces": pieces, "story": state["story"], "cache": meter.report()}


if __name__ == "__main__":
    main(backend_from_args(__doc__))
