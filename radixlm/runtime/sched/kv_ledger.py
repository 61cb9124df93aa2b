"""KV ownership of scheduled requests: rows, slots, cache insertion and reservations.

Ownership follows `radix/base.py`: a request holds its request-to-token row and the KV
slots past its cached prefix; the prefix belongs to the cache, locked on its behalf.
The ledger gives an admitted request its row and (locked) prefix, allocates slots as the
request extends (evicting unlocked cache when the free list is short), inserts its
computed sequence into the cache while it runs and when it leaves, and answers the
scheduler's budget questions: slots reserved for the future decode steps of requests
already admitted (``NewTokenRatio`` x remaining tokens, `runtime/sched/retraction.py`), the
slots one decode step needs, and the pool accounting
free + evictable + protected + held == total.

Sizes are in tokens (KV slots); the allocator hands out whole pages of ``page_size``.
The ledger keeps no per-request state of its own: everything lives on `Req` (row,
kv_len, prefix_len, last_node), so the scheduler's queues stay the only list of requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixlm.radix import MatchResult, PrefixCache
from radixlm.runtime.executor.memory import PagedAllocator, check_fits
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.retraction import NewTokenRatio


class KVLedger:
    """The scheduler's view of the KV pool, the request-to-token table and the cache.

    Args:
        runner: owns the allocator, the request-to-token pool (table int32
            [max_running_requests, context_len + 1] of slot ids) and context_len.
        tree: the prefix cache over the same allocator.
        ratio: the adaptive fraction of remaining tokens reserved per request.
    """

    def __init__(self, runner: ModelRunner, tree: PrefixCache, ratio: NewTokenRatio):
        self.allocator: PagedAllocator = runner.allocator
        self.req_pool = runner.req_to_token_pool
        self.table = self.req_pool.req_to_token
        self.tree = tree
        self.ratio = ratio
        self.page_size = self.allocator.page_size
        self.context_len = runner.context_len

    # ---- budgets (tokens) ---------------------------------------------------------------

    def pages(self, start: int, n: int) -> int:
        """New pages to extend a sequence from `start` to `start + n` tokens."""
        return PagedAllocator.pages_needed(self.page_size, start, n)

    def room(self) -> int:
        """Slots obtainable now: free plus evictable cache."""
        return self.allocator.available() + self.tree.evictable_size()

    def check_fits(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise RequestTooLargeError unless the prompt fits the context and prompt +
        max_new_tokens (capped by the context) fits the whole KV pool."""
        check_fits(
            prompt_len,
            max_new_tokens,
            context_len=self.context_len,
            total_tokens=self.allocator.total,
            page_size=self.page_size,
        )

    def estimate(self, req: Req) -> int:
        """Slots admission reserves for the request's future decode steps:
        ceil(ratio x the most tokens it can still write)."""
        future = min(req.remaining_new_tokens(), max(self.context_len - req.seq_len, 0))
        return int(self.ratio.value * future + 0.999)

    def reserved_tokens(self, running: Sequence[Req], chunked: Req | None) -> int:
        """Slots the running requests (and the rest of the chunked prompt) will still take."""
        pages = sum(self.pages(r.kv_len, self.estimate(r)) for r in running)
        if chunked is not None:
            left = chunked.seq_len - chunked.kv_len
            pages += self.pages(chunked.kv_len, left + self.estimate(chunked))
        return pages * self.page_size

    def decode_tokens(self, reqs: Sequence[Req]) -> int:
        """Slots (whole pages) one more token for each of `reqs` takes."""
        return sum(self.pages(r.kv_len, 1) for r in reqs) * self.page_size

    # ---- a request's row and slots ------------------------------------------------------

    def assign(self, req: Req, match: MatchResult) -> None:
        """Give an admitted request a row holding its cached prefix (`match`, already
        locked by admission); sets req.row, prefix_len, kv_len and last_node."""
        prefix_len = len(match.kv_indices)
        req.prefix_len = req.kv_len = prefix_len
        req.last_node = match.last_node
        req.row = self.req_pool.alloc()
        self.table[req.row, :prefix_len] = match.kv_indices.to(torch.int32)

    def alloc(self, req: Req, start: int, n: int) -> torch.Tensor:
        """Allocate slots for positions start..start+n-1 of `req`, write them to its row
        and return them (int64 [n]); evicts cache when the free list is short.

        Raises OutOfSlotsError when even eviction cannot supply them."""
        short = self.pages(start, n) * self.page_size - self.allocator.available()
        if short > 0:
            self.tree.evict(short)
        last_slot = int(self.table[req.row, start - 1]) if start else 0
        slots = self.allocator.alloc_positions(last_slot, start, n)
        self.table[req.row, start : start + n] = slots.to(torch.int32)
        return slots

    def alloc_decode(self, reqs: Sequence[Req]) -> torch.Tensor:
        """Allocate one slot for each request's next position (its kv_len), write them to
        the requests' rows and return them (int64 [len(reqs)], in request order): the
        slots `alloc(req, req.kv_len, 1)` would give each in turn, from one allocation and
        one table write instead of a Python round trip per request. Evicts cache when the
        free list is short; all or none: raises OutOfSlotsError, allocating nothing, when
        even eviction cannot supply them."""
        ps = self.page_size
        rows = torch.tensor([r.row for r in reqs], dtype=torch.int64)
        pos = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64)
        # A position inside a page follows the slot before it; one at a page start (every
        # position when page_size is 1) takes a fresh page, in request order.
        slots = self.table[rows, (pos - 1).clamp(min=0)].to(torch.int64) + 1
        fresh = pos % ps == 0
        n_new = int(fresh.sum())
        short = n_new * ps - self.allocator.available()
        if short > 0:
            self.tree.evict(short)
        slots[fresh] = self.allocator.alloc_pages(n_new) * ps
        self.table[rows, pos] = slots.to(torch.int32)
        return slots

    def truncate(self, req: Req, end: int) -> None:
        """Free the pages of positions [ceil_page(kv_len), end) of the request's row:
        slots allocated past its computed sequence that hold no kept token (a speculative
        step's rejected drafts). The page holding position kv_len - 1 stays."""
        first = -(-req.kv_len // self.page_size) * self.page_size
        if end > first:
            self.allocator.free(self.table[req.row, first:end].to(torch.int64))

    def cache_running(self, req: Req) -> None:
        """Insert a running request's computed tokens (a prefilled prompt or chunk) into
        the cache, so its next chunk and later admissions hit them (as SGLang does)."""
        kv = self.table[req.row, : req.kv_len].to(torch.int64)
        update = self.tree.cache_unfinished(
            req.all_ids[: req.kv_len], kv, req.prefix_len, req.last_node, req.extra_key
        )
        self.table[req.row, : req.kv_len] = update.kv_indices.to(torch.int32)
        req.prefix_len, req.last_node = update.prefix_len, update.last_node

    def release(self, req: Req) -> None:
        """Insert the request's computed sequence into the cache and free what it owned
        (its row included: req.row becomes -1)."""
        kv = self.table[req.row, : req.kv_len].to(torch.int64)
        self.tree.cache_finished(
            req.all_ids[: req.kv_len], kv, req.prefix_len, req.last_node, req.extra_key
        )
        self.req_pool.free(req.row)
        req.row = -1

    def retract(self, req: Req) -> None:
        """`release` a request that will run again, and reset its KV state to none
        (kv_len = prefix_len = 0): on resume it is admitted anew, mostly from the cache.
        Counts the retraction in req.retractions."""
        self.release(req)
        req.prefix_len = req.kv_len = 0
        req.last_node = None
        req.retractions += 1

    def discard(self, req: Req) -> None:
        """Free what the request owned without caching it (its KV may be partly written)
        and unlock its cached prefix; req.row becomes -1."""
        kv = self.table[req.row, : req.kv_len].to(torch.int64)
        self.tree.release(kv, req.prefix_len, req.last_node)
        self.req_pool.free(req.row)
        req.row = -1

    # ---- introspection ------------------------------------------------------------------

    def accounting(
        self, running: Sequence[Req], chunked: Req | None, pinned: int = 0
    ) -> dict[str, int]:
        """Token counts free, evictable, protected (locked cache not pinned), pinned (the
        `pinned` tokens of `PinTable`: locked cache nodes on pinned paths), held (by the
        requests with a row: the running ones and the one mid-chunk) and total; their sum
        free + evictable + protected + pinned + held equals total. With a second KV tier
        also tier_total == tier_free + tier_used (`PrefixCache.tier_accounting`)."""
        ps = self.page_size
        holders = [*running, chunked] if chunked is not None else running
        held = sum((self.pages(0, r.kv_len) - r.prefix_len // ps) * ps for r in holders)
        return {
            "free": self.allocator.available(),
            "evictable": self.tree.evictable_size(),
            "protected": self.tree.protected_size() - pinned,
            "pinned": pinned,
            "held": held,
            "total": self.allocator.total,
            **self.tree.tier_accounting(),
        }
