"""Scheduler introspection: cumulative counters and the `Scheduler.stats()` snapshot
(exposed by `/get_server_info` and the logs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.runtime.sched.scheduler import Scheduler


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


def scheduler_stats(sched: Scheduler) -> dict[str, int | float | str]:
    """Counters for `/get_server_info` and logs (`SchedulerCounters.as_dict`), the
    pool accounting and token_usage = (total - free - evictable) / total."""
    mem = sched.memory_accounting()
    return {
        "num_running": len(sched.running),
        "num_waiting": len(sched.waiting) + len(sched.compiling),
        "num_chunked": int(sched.chunked is not None),
        "schedule_policy": sched.policy.name,
        "new_token_ratio": round(sched.ratio.value, 4),
        "token_usage": (mem["total"] - mem["free"] - mem["evictable"]) / mem["total"],
        **sched.counters.as_dict(),
        **sched.tree.tier_stats(),
        **sched.decoder.stats(),
        **_jump_stats(sched),
        **(sched.slo.stats() if sched.slo is not None else {}),
        **mem,
    }


def _jump_stats(sched: Scheduler) -> dict[str, int]:
    """Counters of the drafts verified in the plain forward path (`runtime/sched/jump.py`),
    each kind when on: jump-forward draft tokens proposed and kept, constrained requests'
    lookups, and the lookups of requests riding along in mixed steps."""
    drafts = sched.forward_step.drafts
    if drafts is None:
        return {}
    out = {}
    if drafts.jumper is not None:
        out["jump_forward_draft_tokens_total"] = drafts.jumper.drafted
        out["jump_forward_accepted_tokens_total"] = drafts.jumper.accepted
    if drafts.lookup is not None:
        out["constrained_lookup_draft_tokens_total"] = drafts.lookup_drafted
        out["constrained_lookup_accepted_tokens_total"] = drafts.lookup_accepted
    if drafts.riding is not None:
        out["riding_lookup_draft_tokens_total"] = drafts.riding_drafted
        out["riding_lookup_accepted_tokens_total"] = drafts.riding_accepted
    return out
