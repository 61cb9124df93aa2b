"""A request's scheduling state and the per-step output record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from radixlm.runtime.sampling.logprobs import LogprobOptions, TokenLogprobs
from radixlm.runtime.sampling.penalties import uses_processors
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.finish import FinishReason


class SchedOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A request's scheduling options (API extension fields of the same names).

    priority: higher = more important (`priority.py`); default 0.
    slo_ttft_ms / slo_tpot_ms: its TTFT / TPOT targets in ms, > 0 (None: the server's
        --slo-ttft-ms / --slo-tpot-ms); they count only when SLO scheduling is on.
    """

    priority: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


@dataclass(eq=False)
class Req:
    """One generation request as the scheduler sees it (token ids only).

    KV bookkeeping: positions [0, prefix_len) are shared slots of the prefix cache (locked
    via `last_node`); positions [prefix_len, kv_len) are slots this request owns in its
    `row` of the request-to-token table. While kv_len < len(all_ids) - 1 the request is
    still prefilling (mid-chunk, or resumed after a retraction); `extra_key` is its
    cache namespace (e.g. a cache salt): prefixes are shared only within one namespace.

    Sampling draws depend only on (`seed`, output position); the scheduler gives unseeded
    requests a seed at admission. Logprobs (SGLang's fields): `return_logprob` asks for
    the sampled tokens' logprobs (+ `top_logprobs_num` alternatives, + the logprobs of
    the ids in `token_ids_logprob` at every position); with
    `logprob_start_len` >= 0 also for the prompt tokens from that position on, gathered
    in `input_logprobs` while the prompt is prefilled and sent with the first output.
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
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    seed: int = 0
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    input_logprobs: TokenLogprobs | None = None
    input_logprobs_sent: bool = False
    retractions: int = 0  # times retracted; >0 means output_ids are re-prefilled on resume
    grammar: Any = None  # xgrammar GrammarMatcher that has accepted output_ids (grammar.py)
    arrival_time: float = field(default_factory=time.perf_counter)  # s, perf_counter clock
    queue_time: float = -1.0  # s from arrival to first admission; -1 until admitted
    spec_verify_steps: int = 0  # speculative verify steps this request took part in
    spec_emitted_tokens: int = 0  # tokens those steps emitted (accepted drafts + bonus)
    priority: int = 0  # higher = more important: admitted first, retracted last
    slo_ttft_ms: float | None = None  # this request's targets (None: the server's, if any)
    slo_tpot_ms: float | None = None
    first_token_time: float = -1.0  # s, the scheduler's clock; -1 until the first token

    @classmethod
    def new(
        cls,
        rid: str,
        input_ids: list[int],
        params: SamplingParams,
        *,
        extra_key: Any = None,
        logprobs: LogprobOptions | None = None,
        sched: SchedOptions | None = None,
    ) -> Req:
        """A request not yet scheduled, with its logprob settings taken from `logprobs`
        (None: no logprobs) and its priority and SLO targets from `sched`. The one way
        callers (Engine, scheduler process) build a Req; the scheduler fills in the rest
        of its state."""
        lp = logprobs or LogprobOptions()
        so = sched or SchedOptions()
        return cls(
            rid=rid,
            input_ids=input_ids,
            params=params,
            extra_key=extra_key,
            return_logprob=lp.return_logprob,
            logprob_start_len=lp.logprob_start_len,
            top_logprobs_num=lp.top_logprobs_num,
            token_ids_logprob=lp.token_ids_logprob,
            priority=so.priority,
            slo_ttft_ms=so.slo_ttft_ms,
            slo_tpot_ms=so.slo_tpot_ms,
        )

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by the generated tokens."""
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        """len(all_ids) without building the list: prompt plus generated tokens."""
        return len(self.input_ids) + len(self.output_ids)

    @property
    def argmax_only(self) -> bool:
        """Whether only the argmax of this request's raw logits is used: greedy, with no
        logit processor (`uses_processors`), logprobs or grammar."""
        return (
            self.params.is_greedy
            and not uses_processors(self.params)
            and not self.return_logprob
            and self.grammar is None
        )

    def prompt_logprobs_pending(self) -> bool:
        """Whether prompt logprobs were asked for and not yet sent."""
        return self.return_logprob and self.logprob_start_len >= 0 and not self.input_logprobs_sent

    def match_limit(self) -> int:
        """Tokens of `all_ids` the prefix cache may match: all but the last (it must run to
        produce logits), and no further than ``logprob_start_len - 1`` while prompt
        logprobs are pending (a cached position has no logits)."""
        limit = self.seq_len - 1
        if self.prompt_logprobs_pending():
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return limit

    def spec_accept_length(self) -> float:
        """Mean tokens per speculative verify step (0.0 without speculation)."""
        steps = self.spec_verify_steps
        return self.spec_emitted_tokens / steps if steps else 0.0

    def remaining_new_tokens(self) -> int:
        """Tokens still allowed by max_new_tokens."""
        return max(self.params.max_new_tokens - len(self.output_ids), 0)

    def step_output(self, new_ids: list[int], logprobs: TokenLogprobs | None = None) -> ReqOutput:
        """This step's record of the request: `new_ids` (with their `logprobs`) and its
        current state. Prompt logprobs ride on its first record once the prompt is
        prefilled (kv_len >= len(input_ids)); they are handed over once (then marked sent)."""
        input_lp = None
        prefilled = self.kv_len >= len(self.input_ids)
        if self.input_logprobs is not None and not self.input_logprobs_sent and prefilled:
            input_lp, self.input_logprobs = self.input_logprobs, None
            self.input_logprobs_sent = True
        return ReqOutput(
            self.rid,
            new_ids,
            self.finish_reason,
            self.matched_stop,
            len(self.input_ids),
            len(self.output_ids),
            self.cached_tokens,
            logprobs,
            input_lp,
            self.queue_time,
            self.spec_accept_length(),
        )


class ReqOutput(NamedTuple):
    """What one step produced for one request.

    new_token_ids: tokens generated in this step (empty for a finished-without-token event).
    finish_reason: None while running, else a `FinishReason` (stop, length, abort).
    matched_stop: the EOS / stop token id or the stop string that ended it, if any.
    output_logprobs: logprobs of new_token_ids (requests with return_logprob), else None.
    input_logprobs: prompt-token logprobs, on the first output after the prompt's prefill
        (requests with logprob_start_len >= 0), else None.
    queue_time: seconds the request waited before its first admission (-1: never admitted).
    spec_accept_length: mean tokens per speculative verify step so far (0.0: none ran).
    """

    rid: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None
    matched_stop: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_logprobs: TokenLogprobs | None = None
    input_logprobs: TokenLogprobs | None = None
    queue_time: float = -1.0
    spec_accept_length: float = 0.0
