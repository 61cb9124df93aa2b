"""Request priorities: an integer per request, higher = more important (default 0).

Convention (the same on every route and in the program language): a request of higher
priority is admitted before any waiting request of lower priority, and under KV pressure
lower priorities are retracted first (`retraction.retraction_order`). Requests of equal
priority keep the order of the configured schedule policy (lpm, dfs-weight, fcfs, ...).
This is SGLang's orientation with its priority scheduling on (vLLM's is the opposite:
lower values first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def by_priority(ordered: Sequence[Any]) -> list[Any]:
    """`ordered` (the policy's order) regrouped by priority, highest first; stable, so
    equal priorities keep the policy's order and all-default priorities change nothing."""
    return sorted(ordered, key=lambda r: -r.priority)
