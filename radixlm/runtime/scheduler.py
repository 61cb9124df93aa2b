"""Continuous-batching scheduler: waiting queue, running batch, extend and decode steps.

Each `step()` runs one iteration (Orca-style iteration-level batching, Yu et al. 2022):
an EXTEND batch when waiting requests can be admitted, otherwise a DECODE batch of all
running requests. Prompts are matched against the prefix cache on admission, so only the
uncached suffix is prefilled; finished sequences are inserted back into the cache.

Admission reserves KV for the full remaining `max_new_tokens` of every running request,
so a decode step never runs out of slots; the prefix cache is evicted (LRU, unlocked
leaves) when free slots run short.
"""

from __future__ import annotations

import logging
import random
from collections import deque

import torch

from radixlm.config import ServerArgs
from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.radix import make_prefix_cache
from radixlm.runtime.memory import PagedAllocator
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import Req, ReqOutput
from radixlm.runtime.sampling import Sampler

logger = logging.getLogger(__name__)


class Scheduler:
    """Schedules requests over one ModelRunner.

    Args:
        args: engine settings. runner: the loaded model and pools.
        eos_token_ids: token ids that end generation unless `ignore_eos`.
        tokenizer: decodes output tails for stop strings (requests with `stop` need it).
    """

    def __init__(
        self, args: ServerArgs, runner: ModelRunner, eos_token_ids: list[int], tokenizer=None
    ):
        self.args = args
        self.runner = runner
        self.page_size = args.page_size
        self.allocator: PagedAllocator = runner.allocator
        self.req_pool = runner.req_to_token_pool
        self.table = self.req_pool.req_to_token
        self.tree = make_prefix_cache(args.disable_radix_cache, args.page_size, self.allocator.free)
        self.eos_token_ids = set(eos_token_ids)
        self.sampler = Sampler()
        self.tokenizer = tokenizer
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._pending: list[ReqOutput] = []
        self._seed_rng = random.Random(args.random_seed)

    # ---- queue management -------------------------------------------------------------

    def add_request(self, req: Req) -> None:
        """Queue a validated request."""
        if not req.params.is_greedy:
            seed = req.params.seed
            if seed is None:  # reproducible per engine: drawn in arrival order
                seed = self._seed_rng.getrandbits(63)
            req.generator = torch.Generator().manual_seed(seed)
        self.waiting.append(req)

    def abort(self, rid: str) -> bool:
        """Stop request `rid` wherever it is; its slots are freed at once. Returns found."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._finish(req, "abort", release=False)
                return True
        for req in self.running:
            if req.rid == rid:
                self.running.remove(req)
                self._finish(req, "abort")
                return True
        return False

    # ---- one iteration ----------------------------------------------------------------

    def step(self) -> list[ReqOutput]:
        """Run one extend or decode step; return the outputs of every request it touched."""
        batch = self._admit()
        extend = bool(batch)
        if extend:
            fb = self._build_extend(batch)
        elif self.running:
            batch = list(self.running)
            fb = self._build_decode(batch)
        else:
            out, self._pending = self._pending, []
            return out
        try:
            logits = self.runner.forward(fb)
            next_ids = self.sampler.sample(
                logits, [r.params for r in batch], [r.generator for r in batch]
            ).tolist()
        except Exception:
            self._fail(batch)
            raise
        outputs = self._process(batch, next_ids)
        if extend:
            self._cache_prefilled([r for r in batch if r.finish_reason is None])
        return outputs

    def _cache_prefilled(self, reqs: list[Req]) -> None:
        """Insert freshly prefilled prompts into the cache while they keep decoding, so
        requests admitted in later steps hit their shared prefix (as SGLang does)."""
        for req in reqs:
            kv = self.table[req.row, : req.kv_len].to(torch.int64)
            update = self.tree.cache_unfinished(
                req.all_ids[: req.kv_len], kv, req.prefix_len, req.last_node, req.extra_key
            )
            self.table[req.row, : req.kv_len] = update.kv_indices.to(torch.int32)
            req.prefix_len, req.last_node = update.prefix_len, update.last_node

    def _fail(self, batch: list[Req]) -> None:
        """A step raised: abort its requests and free their slots without caching them
        (their KV may be partly written)."""
        logger.exception("step failed; aborting %d requests", len(batch))
        for req in batch:
            if req in self.running:
                self.running.remove(req)
            kv = self.table[req.row, : req.kv_len].to(torch.int64)
            self.tree.release(kv, req.prefix_len, req.last_node)
            self.req_pool.free(req.row)
            req.row = -1
            req.finish_reason = "abort"
            self._pending.append(self._output(req, []))

    def _admit(self) -> list[Req]:
        """Pop waiting requests (FCFS) that fit the KV, row and prefill-token budgets."""
        admitted: list[Req] = []
        budget = self.allocator.available() - self._reserved_tokens(self.running)
        prefill_tokens = 0
        while self.waiting and self.req_pool.available() > len(admitted):
            req = self.waiting[0]
            ids = req.all_ids
            # Match at most len-1 tokens: the last one must run to produce logits.
            match = self.tree.match_prefix(ids[:-1], req.extra_key)
            prefix_len = len(match.kv_indices)
            extend = len(ids) - prefix_len
            if admitted and prefill_tokens + extend > self.args.max_prefill_tokens:
                break
            self.tree.lock(match.last_node)
            need = self._pages(prefix_len, extend + self._future_tokens(req)) * self.page_size
            if need > budget + self.tree.evictable_size():
                self.tree.unlock(match.last_node)
                if not admitted and not self.running:
                    # Nothing runs and nothing else can be freed: it can never fit.
                    logger.error("request %s needs %d KV slots > capacity", req.rid, need)
                    self.waiting.popleft()
                    self._finish(req, "abort", release=False)
                    continue
                break
            self.waiting.popleft()
            budget -= need
            prefill_tokens += extend
            req.prefix_len = req.kv_len = prefix_len
            req.cached_tokens = prefix_len
            req.last_node = match.last_node
            req.row = self.req_pool.alloc()
            self.table[req.row, :prefix_len] = match.kv_indices.to(torch.int32)
            admitted.append(req)
        return admitted

    def _build_extend(self, batch: list[Req]) -> ForwardBatch:
        ids, positions, locs, ext_lens, pre_lens = [], [], [], [], []
        for req in batch:
            all_ids = req.all_ids
            start, n = req.kv_len, len(all_ids) - req.kv_len
            slots = self._alloc(req, start, n)
            ids.extend(all_ids[start:])
            positions.extend(range(start, start + n))
            locs.append(slots)
            ext_lens.append(n)
            pre_lens.append(start)
        return self._forward_batch(
            ForwardMode.EXTEND, batch, ids, positions, locs, pre_lens, ext_lens
        )

    def _build_decode(self, batch: list[Req]) -> ForwardBatch:
        locs = [self._alloc(req, req.kv_len, 1) for req in batch]
        ids = [req.output_ids[-1] for req in batch]
        positions = [req.kv_len for req in batch]
        return self._forward_batch(
            ForwardMode.DECODE, batch, ids, positions, locs, positions, [1] * len(batch)
        )

    def _forward_batch(self, mode, batch, ids, positions, locs, pre_lens, ext_lens) -> ForwardBatch:
        pre = torch.tensor(pre_lens, dtype=torch.int64)
        ext = torch.tensor(ext_lens, dtype=torch.int64)
        for req, n in zip(batch, ext_lens):
            req.kv_len += n
        return ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            out_cache_loc=torch.cat(locs),
            req_pool_indices=torch.tensor([r.row for r in batch], dtype=torch.int64),
            seq_lens=pre + ext,
            extend_prefix_lens=pre,
            extend_seq_lens=ext,
            req_to_token=self.table,
        )

    def _process(self, batch: list[Req], next_ids: list[int]) -> list[ReqOutput]:
        outputs, self._pending = self._pending, []
        still_running = [r for r in self.running if r not in batch]
        for req, tok in zip(batch, next_ids):
            if req.params.max_new_tokens == 0:
                outputs.append(self._finish(req, "length"))
                continue
            req.output_ids.append(tok)
            reason = self._check_finish(req, tok)
            if reason is None:
                still_running.append(req)
                outputs.append(self._output(req, [tok]))
            else:
                outputs.append(self._finish(req, reason, new_ids=[tok]))
        self.running = still_running
        return outputs

    def _check_finish(self, req: Req, tok: int) -> str | None:
        p = req.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_token_ids):
            req.matched_stop = tok
            return "stop"
        if p.stop and self._matched_stop_str(req) is not None:
            return "stop"
        if len(req.output_ids) >= p.max_new_tokens or req.kv_len + 1 >= self.runner.context_len:
            return "length"
        return None

    def _matched_stop_str(self, req: Req) -> str | None:
        """The first stop string ending in the output's decoded tail, recorded in
        `req.matched_stop`. Every token holds at least one byte, so the last
        len(utf-8 bytes of stop)+1 tokens cover any occurrence the newest token completed."""
        window = max(len(s.encode("utf-8")) for s in req.params.stop) + 1
        tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=True)
        for s in req.params.stop:
            if s in tail:
                req.matched_stop = s
                return s
        return None

    # ---- memory -----------------------------------------------------------------------

    def _pages(self, start: int, n: int) -> int:
        return PagedAllocator.pages_needed(self.page_size, start, n)

    def _reserved_tokens(self, reqs: list[Req]) -> int:
        """Slots still to be allocated by running requests' future decode steps."""
        return sum(self._pages(r.kv_len, self._future_tokens(r)) for r in reqs) * self.page_size

    def _future_tokens(self, req: Req) -> int:
        """Upper bound on KV slots the request's decode steps still write."""
        return min(req.remaining_new_tokens(), max(self.runner.context_len - len(req.all_ids), 0))

    def _alloc(self, req: Req, start: int, n: int) -> torch.Tensor:
        """Allocate slots for positions start..start+n-1 of `req`, evicting cache if needed."""
        short = self._pages(start, n) * self.page_size - self.allocator.available()
        if short > 0:
            self.tree.evict(short)
        last_slot = int(self.table[req.row, start - 1]) if start else 0
        slots = self.allocator.alloc_positions(last_slot, start, n)
        self.table[req.row, start : start + n] = slots.to(torch.int32)
        return slots

    def _release(self, req: Req) -> None:
        """Insert the request's computed sequence into the cache and free what it owned."""
        kv = self.table[req.row, : req.kv_len].to(torch.int64)
        self.tree.cache_finished(
            req.all_ids[: req.kv_len], kv, req.prefix_len, req.last_node, req.extra_key
        )
        self.req_pool.free(req.row)
        req.row = -1

    def _finish(self, req: Req, reason: str, new_ids=(), release: bool = True) -> ReqOutput:
        req.finish_reason = reason
        if release:
            self._release(req)
        out = self._output(req, list(new_ids))
        if reason == "abort":
            self._pending.append(out)
        return out

    def _output(self, req: Req, new_ids: list[int]) -> ReqOutput:
        return ReqOutput(
            req.rid,
            new_ids,
            req.finish_reason,
            req.matched_stop,
            len(req.input_ids),
            len(req.output_ids),
            req.cached_tokens,
        )

    def memory_accounting(self) -> dict[str, int]:
        """Token counts: free + evictable + protected + held == total (checked in tests)."""
        held = sum(
            (self._pages(0, r.kv_len) - r.prefix_len // self.page_size) * self.page_size
            for r in self.running
        )
        return {
            "free": self.allocator.available(),
            "evictable": self.tree.evictable_size(),
            "protected": self.tree.protected_size(),
            "held": held,
            "total": self.allocator.total,
        }
