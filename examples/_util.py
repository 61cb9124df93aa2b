"""Shared by the examples: pick a backend and report the prefix-cache hit rate.

Every example runs on the bundled model in-process (`radixlm.Engine`) by default, or on a
running server with ``--url http://127.0.0.1:30000`` (`radixlm serve --model smollm2-135m`).
"""

from __future__ import annotations

import argparse
from typing import Any

import radixlm as rl


def backend_from_args(description: str) -> Any:
    """An Engine on the bundled model, or a RuntimeEndpoint when --url is given."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="a running radixlm server (default: in-process Engine)")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    if args.url:
        return rl.RuntimeEndpoint(args.url, api_key=args.api_key)
    return rl.Engine(model="smollm2-135m", max_total_tokens=16384)


class CacheMeter:
    """Prompt tokens and prefix-cache hits between construction and `report()`."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.start = self._counters()

    def _counters(self) -> dict[str, int] | None:
        try:
            stats = rl.get_server_info(self.backend)["scheduler"]
        except Exception:  # noqa: BLE001 - backends without server counters (OpenAI)
            return None
        return {k: stats[k] for k in ("prompt_tokens_total", "cached_tokens_total")}

    def report(self) -> dict[str, float] | None:
        """Print and return {prompt_tokens, cached_tokens, cache_hit_rate} since start."""
        end = self._counters()
        if end is None or self.start is None:
            print("cache hit rate: n/a (the backend reports no cache counters)")
            return None
        prompt = end["prompt_tokens_total"] - self.start["prompt_tokens_total"]
        cached = end["cached_tokens_total"] - self.start["cached_tokens_total"]
        rate = cached / prompt if prompt else 0.0
        print(f"cache hit rate: {rate:.1%} ({cached} of {prompt} prompt tokens from the cache)")
        return {"prompt_tokens": prompt, "cached_tokens": cached, "cache_hit_rate": rate}
