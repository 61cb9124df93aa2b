"""One admission round: the budgets an extend step is planned under.

After SGLang's ``PrefillAdder`` (python/sglang/srt/managers/schedule_policy.py). A round
starts with two budgets -- prefill tokens this step may compute and KV slots that are
free after reserving room for running decodes -- and admits requests one by one until
either runs out. A prompt longer than the remaining token budget is split when chunking
is on (its first chunk runs now); otherwise it may run only alone. Requests sharing a
not-yet-cached prefix with one already planned are skipped this round
(`InBatchPrefixGuard`). Each admitted request is started by `start_request`.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from radixlm.radix import MatchResult, PrefixCache
from radixlm.radix.policy import InBatchPrefixGuard
from radixlm.runtime.executor.memory import PagedAllocator
from radixlm.runtime.sampling.logprobs import initial_input_logprobs
from radixlm.runtime.sched.request import Req

if TYPE_CHECKING:
    from radixlm.runtime.sched.kv_ledger import KVLedger
    from radixlm.runtime.sched.stats import SchedulerCounters

#: Requests planned for one extend step: (request, new tokens computed from req.kv_len).
Plan = list[tuple[Req, int]]


class Added(enum.Enum):
    """Outcome of `PrefillAdder.try_add`."""

    YES = enum.auto()  # planned; its cache path is locked
    SKIP = enum.auto()  # not this round (shares an uncached prefix); try the next one
    STOP = enum.auto()  # a budget ran out; end the round


class PrefillAdder:
    """Plans one extend step.

    Args:
        tree: the prefix cache (requests are matched and their path locked on admission).
        page_size: tokens per KV page.
        rem_tokens: prefill tokens the step may compute.
        kv_budget: KV slots (tokens) free for this step's admissions, reservations for
            running requests already subtracted; evictable cache is added per check.
        chunking: split a prompt longer than the remaining token budget.
    """

    def __init__(
        self, tree: PrefixCache, page_size: int, rem_tokens: int, kv_budget: int, chunking: bool
    ):
        self.tree = tree
        self.page_size = page_size
        self.rem_tokens = rem_tokens
        self.kv_budget = kv_budget
        self.chunking = chunking
        self.guard = InBatchPrefixGuard(page_size)
        self.plan: Plan = []
        self.chunked: Req | None = None  # the request left mid-chunk after this step

    def add_chunked(self, req: Req) -> bool:
        """Plan the next chunk of the request mid-chunk (its KV was reserved at its
        admission). Returns True when it completes its prompt in this step."""
        left = req.seq_len - req.kv_len
        n = min(left, self.rem_tokens)
        self.plan.append((req, n))
        self.guard.add(req.all_ids, req.extra_key)
        self.rem_tokens -= n
        if n < left:
            self.chunked = req
        return n == left

    def try_add(self, req: Req, future_tokens: int) -> tuple[Added, MatchResult | None]:
        """Try to plan a waiting request that will decode about `future_tokens` tokens.

        On YES returns the (locked) match: the caller gives the request its row.
        """
        if self.rem_tokens <= 0 or self.chunked is not None:
            return Added.STOP, None
        ids = req.all_ids
        # The last token must run to produce logits; prompt logprobs limit the match more.
        limit = req.match_limit()
        # A prefix held only in the second KV tier is copied back now; its slots come out
        # of this round's KV budget (counted in full even when eviction supplied them).
        room = self.kv_budget + self.tree.evictable_size()
        match, loaded = self.tree.load_back(ids[:limit], req.extra_key, room)
        self.kv_budget -= loaded
        prefix_len = len(match.kv_indices)
        extend = len(ids) - prefix_len
        # A limited match recomputes the shared prefix anyway: waiting would not help.
        if limit == len(ids) - 1 and self.guard.conflicts(ids, prefix_len, req.extra_key):
            return Added.SKIP, None  # a planned request computes the shared prefix first
        n = extend
        if extend > self.rem_tokens:
            if self.chunking:
                n = self.rem_tokens  # first chunk now, the rest in later steps
            elif self.plan:
                return Added.STOP, None  # unchunked: a single longer prompt runs alone
        self.tree.lock(match.last_node)
        ps = self.page_size
        need = PagedAllocator.pages_needed(ps, prefix_len, extend + future_tokens) * ps
        if need > self.kv_budget + self.tree.evictable_size():
            self.tree.unlock(match.last_node)
            return Added.STOP, None
        self.kv_budget -= need
        self.plan.append((req, n))
        self.guard.add(ids, req.extra_key)
        self.rem_tokens -= n
        if n < extend:
            self.chunked = req
        return Added.YES, match


def start_request(req: Req, match, kv: KVLedger, counters: SchedulerCounters) -> None:
    """Give an admitted request its row and its (locked) cached prefix."""
    kv.assign(req, match)
    if req.prompt_logprobs_pending():  # (re)computed from logprob_start_len on
        start = req.logprob_start_len
        req.input_logprobs = initial_input_logprobs(
            req.input_ids, start, req.top_logprobs_num, req.token_ids_logprob
        )
    if req.retractions == 0:  # usage and hit rate describe the original prompt
        req.queue_time = time.perf_counter() - req.arrival_time
        req.cached_tokens = req.prefix_len
        counters.prompt_tokens += len(req.input_ids)
        counters.cached_tokens += req.prefix_len
