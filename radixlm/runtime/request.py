"""A request's scheduling state and the per-step output record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from radixlm.runtime.sampling import SamplingParams


@dataclass(eq=False)
class Req:
    """One generation request as the scheduler sees it (token ids only).

    KV bookkeeping: positions [0, prefix_len) are shared slots of the prefix cache (locked
    via `last_node`); positions [prefix_len, kv_len) are slots this request owns in its
    `row` of the request-to-token table. While kv_len < len(all_ids) - 1 the request is
    still prefilling (mid-chunk, or resumed after a retraction); `extra_key` is its
    cache namespace (e.g. a cache salt): prefixes are shared only within one namespace.
    """

    rid: str
    input_ids: list[int]
    params: SamplingParams
    extra_key: Any = None
    output_ids: list[int] = field(default_factory=list)
    row: int = -1
    prefix_len: int = 0
    last_node: Any = None
    kv_len: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    generator: torch.Generator | None = None
    retractions: int = 0  # times retracted; >0 means output_ids are re-prefilled on resume
    spec_verify_steps: int = 0  # speculative verify steps this request took part in
    spec_emitted_tokens: int = 0  # tokens those steps emitted (accepted drafts + bonus)

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by the generated tokens."""
        return self.input_ids + self.output_ids

    def spec_accept_length(self) -> float:
        """Mean tokens per speculative verify step (0.0 without speculation)."""
        steps = self.spec_verify_steps
        return self.spec_emitted_tokens / steps if steps else 0.0

    def remaining_new_tokens(self) -> int:
        """Tokens still allowed by max_new_tokens."""
        return max(self.params.max_new_tokens - len(self.output_ids), 0)


class ReqOutput(NamedTuple):
    """What one step produced for one request.

    new_token_ids: tokens generated in this step (empty for a finished-without-token event).
    finish_reason: None while running, else "stop", "length" or "abort".
    matched_stop: the EOS / stop token id or the stop string that ended it, if any.
    spec_accept_length: mean tokens per speculative verify step so far (0.0: none ran).
    """

    rid: str
    new_token_ids: list[int]
    finish_reason: str | None
    matched_stop: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    spec_accept_length: float = 0.0
