"""Cumulative scheduler counters (exposed by `Scheduler.stats()` and `/get_server_info`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerCounters:
    """Totals since the scheduler started. Units: tokens unless named otherwise.

    prompt_tokens / cached_tokens: prompt tokens of admitted requests and how many of
        them the prefix cache supplied, counted once per request at its first admission
        (later chunks and resumes after a retraction do not count).
    prefill_tokens: tokens computed by extend steps (includes re-prefill after retraction).
    decode_tokens: tokens computed by decode steps (and decodes inside mixed steps).
    retracted / aborted / rejected: request counts.
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    extend_steps: int = 0
    decode_steps: int = 0
    retracted: int = 0
    aborted: int = 0
    rejected: int = 0

    def as_dict(self) -> dict[str, int | float]:
        """Counters with stable public names; cache_hit_rate = cached / prompt tokens."""
        hit_rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {
            "num_retracted_total": self.retracted,
            "num_aborted_total": self.aborted,
            "num_rejected_total": self.rejected,
            "prompt_tokens_total": self.prompt_tokens,
            "cached_tokens_total": self.cached_tokens,
            "cache_hit_rate": hit_rate,
            "prefill_tokens_total": self.prefill_tokens,
            "decode_tokens_total": self.decode_tokens,
            "num_extend_steps": self.extend_steps,
            "num_decode_steps": self.decode_steps,
        }


def format_stats(s: dict) -> str:
    """One log line from `Scheduler.stats()`."""
    return (
        f"running {s['num_running']}, waiting {s['num_waiting']}, "
        f"token usage {s['token_usage']:.2f}, cache hit rate {s['cache_hit_rate']:.3f}, "
        f"retracted {s['num_retracted_total']}"
    )
