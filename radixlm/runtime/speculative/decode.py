"""The speculative decode step: draft, verify the trees in one target forward, commit.

One step over the running requests (when there are at most --speculative-max-batch-size
of them, each can speculate and the budget grants at least one draft token; otherwise
the plain decode step runs):

1. Budget: each request may draft n_i <= --speculative-num-draft-tokens tokens, capped so
   that it cannot pass max_new_tokens or the context, and dropped to 0 when the KV pool
   (free + evictable) cannot hold every request's n_i + 1 slots; the `DraftBudget`
   (`budget.py`, --speculative-budget) then keeps the drafts worth their cost.
2. Allocate n_i + 1 slots at positions kv_len .. kv_len + n_i of each row (root + drafts).
3. Draft (`Drafter.draft`), then one TARGET_VERIFY forward over [root, drafts] with the
   tree mask (prefix fully visible, drafts see their ancestors), positions kv_len + depth;
   when every tree is a chain, the same forward as a causal EXTEND returning all logits.
4. Accept (`accept.py`): greedy matching or exact rejection sampling; emit the accepted
   tokens and the bonus token one by one through the StopChecker, stopping at the first
   stop (EOS, stop ids, stop string, length, context): nothing after it is emitted.
5. Commit: the KV of the m kept nodes (root + accepted drafts, m = tokens emitted) moves
   to positions kv_len .. kv_len + m - 1 (a copy only when a tree path is not the first
   branch), kv_len advances by m, and every page past the new length is freed, so the
   pool invariant holds and later caching sees an ordinary sequence.

The step returns a `DecodeResult` (tokens and finish reason per request); the Scheduler
commits it (outputs, finished requests, its counters). Slots go through the KV ledger of
the `DecodeContext`; on an error the step frees its extra slots and re-raises, and the
scheduler aborts the batch.

Invariant between steps (as for plain decode): kv_len == len(all_ids) - 1.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from radixlm.config import ServerArgs
from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.runtime.executor.batch import extend_batch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.sampling.random_draw import row_keys
from radixlm.runtime.sched.decode import DecodeContext, DecodeResult
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.kv_ledger import KVLedger
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.stop import StopChecker
from radixlm.runtime.speculative.accept import accept_greedy, accept_sampled
from radixlm.runtime.speculative.base import (
    DraftContext,
    Drafter,
    DraftTree,
    Verified,
)
from radixlm.runtime.speculative.budget import DraftBudget, make_budget

logger = logging.getLogger(__name__)


@dataclass
class SpecCounters:
    """Totals since start. verify_steps counts request-steps (one request, one verify)."""

    verify_steps: int = 0
    emitted_tokens: int = 0
    draft_tokens: int = 0
    accepted_drafts: int = 0
    plain_steps: int = 0
    draft_seconds: float = 0.0
    step_seconds: float = 0.0

    def as_dict(self) -> dict[str, int | float]:
        """spec_accept_length = tokens emitted per request-step (accepted drafts + bonus);
        spec_accept_rate = accepted / proposed draft tokens; spec_draft_time_share = time
        in the drafter / time in speculative steps."""
        v = self.verify_steps
        return {
            "spec_verify_steps_total": v,
            "spec_plain_decode_steps_total": self.plain_steps,
            "spec_draft_tokens_total": self.draft_tokens,
            "spec_accepted_tokens_total": self.accepted_drafts,
            "spec_accept_length": self.emitted_tokens / v if v else 0.0,
            "spec_accept_rate": self.accepted_drafts / self.draft_tokens
            if self.draft_tokens
            else 0.0,
            "spec_draft_time_share": self.draft_seconds / self.step_seconds
            if self.step_seconds
            else 0.0,
        }


def speculatable(req: Req) -> bool:
    """Whether the request's next tokens depend only on the target logits at each node
    (penalties, logprobs and grammars track per-token state along one path and run
    the plain decode step instead)."""
    p = req.params
    return (
        p.frequency_penalty == 0.0
        and p.presence_penalty == 0.0
        and p.repetition_penalty == 1.0
        and not p.logit_bias
        and len(req.output_ids) >= p.min_new_tokens
        and not req.return_logprob
        and req.grammar is None
    )


class SpeculativeDecode:
    """Decode strategy that drafts with `drafter` and verifies with the target.

    Args:
        args: --speculative-* settings. runner: the target ModelRunner.
        drafter: the `Drafter` proposing trees.
        budget: the `DraftBudget` (default: the one --speculative-budget names).
    """

    def __init__(
        self,
        args: ServerArgs,
        runner: ModelRunner,
        drafter: Drafter,
        budget: DraftBudget | None = None,
    ):
        self.runner = runner
        self.drafter = drafter
        self.budget = budget or make_budget(args.speculative_budget)
        self.num_draft = args.speculative_num_draft_tokens
        self.max_batch_size = args.speculative_max_batch_size
        self.counters = SpecCounters()
        # Constrained requests are never speculated here (`speculatable`): they decode in
        # the plain step, which verifies their jump-forward drafts and, where nothing is
        # forced, the drafter's model-free lookup cut to what the grammar accepts.
        self.allows_jump_forward = not drafter.tracks_positions
        self.constrained_lookup = drafter.lookup if self.allows_jump_forward else None
        # Requests decoding beside a prefill (a mixed step) skip this strategy's step; they
        # verify the same lookup in the plain forward path instead.
        self.riding_lookup = self._riding_drafts if self.allows_jump_forward else None
        if drafter.needs_hidden:  # every target forward must leave its hidden states
            runner.capture_hidden_states()

    # ---- hooks called by the scheduler ----------------------------------------------

    def after_forward(self, fb: ForwardBatch, reqs: list[Req], next_ids: dict) -> None:
        """Keep the drafter in sync after a forward the scheduler ran itself."""
        self.drafter.observe(fb, reqs, next_ids, self._hidden())

    def _riding_drafts(self, reqs: list[Req]) -> list[list[int]]:
        """The drafter's lookup (at most --speculative-num-draft-tokens tokens) for each
        of `reqs`, riding along in a mixed step; [] where this strategy would not
        speculate (more than --speculative-max-batch-size requests, or a request that is
        not `speculatable`) and for sampled requests: a draw from an extend row's logits
        may differ from a decode step's in the last bits, enough to move a draw lying at a
        token boundary."""
        if len(reqs) > self.max_batch_size:
            return [[] for _ in reqs]
        return [
            self.drafter.lookup(r)[: self.num_draft]
            if r.params.is_greedy and speculatable(r)
            else []
            for r in reqs
        ]

    def stats(self) -> dict[str, int | float]:
        """Speculation counters for `Scheduler.stats()`."""
        return {**self.counters.as_dict(), **self.budget.stats(), **self.drafter.stats()}

    def decode(self, ctx: DecodeContext, reqs: list[Req]) -> DecodeResult:
        """One decode step over the running requests `reqs` (see the module docstring).

        Raises what the drafter or the target forward raises, after freeing the slots it
        allocated for the step (the caller aborts the batch)."""
        t0 = time.perf_counter()
        kv = ctx.kv
        budgets = None
        if len(reqs) <= self.max_batch_size and all(speculatable(r) for r in reqs):
            budgets = self.budget.plan(reqs, self._budgets(kv, reqs))
        if not budgets or not any(budgets):  # nothing to verify: the plain step is cheaper
            self.counters.plain_steps += 1
            result = ctx.plain_decode(reqs)
            self.budget.observe_step(len(reqs), time.perf_counter() - t0)
            return result
        starts = [r.kv_len for r in reqs]
        allocated: list[Req] = []
        try:
            for req, n in zip(reqs, budgets):
                kv.alloc(req, req.kv_len, n + 1)
                allocated.append(req)
            t1 = time.perf_counter()
            trees = self.drafter.draft(DraftContext(reqs, budgets, kv.table))
            trees = [_clip(t, n) for t, n in zip(trees, budgets)]
            t2 = time.perf_counter()
            fb = self._verify_batch(kv.table, reqs, trees)
            # Greedy acceptance reads only each row's argmax (`accept_greedy`), so an
            # all-greedy verify may take the head's argmax screen like a decode step.
            fb.argmax_only = all(r.argmax_only for r in reqs)
            logits = self.runner.forward(fb)
            accepted = self._accept(reqs, trees, logits)
        except Exception:
            for req, start, n in zip(allocated, starts, budgets):
                kv.truncate(req, start + n + 1)
            raise
        result = self._commit(ctx, reqs, starts, budgets, trees, accepted)
        c = self.counters
        c.draft_seconds += (t2 - t1) + self._observe_seconds
        seconds = time.perf_counter() - t0
        c.step_seconds += seconds
        self.budget.observe_step(sum(len(t) + 1 for t in trees), seconds)
        self.budget.observe_verify(
            [
                (req, max(tree.depths()), len(path) - 1)
                for req, tree, (path, _, _) in zip(reqs, trees, accepted)
                if len(tree)
            ]
        )
        return result

    # ---- steps -------------------------------------------------------------------------

    def _budgets(self, kv: KVLedger, reqs: list[Req]) -> list[int]:
        """Draft tokens per request: capped by max_new_tokens, the context and, where the
        budget plans `within_available`, what the drafter has for it; 0 for requests whose
        extra slots the pool cannot supply (one slot each is reserved)."""
        ps = kv.page_size
        context = self.runner.context_len
        room = kv.room() - kv.decode_tokens(reqs)
        within = self.budget.within_available
        budgets = []
        for req in reqs:
            seq = req.seq_len
            n = min(self.num_draft, req.remaining_new_tokens() - 1, context - seq - 1)
            n = max(n, 0)
            if n and within and (have := self.drafter.available(req)) is not None:
                n = min(n, have)
            extra = (kv.pages(req.kv_len, n + 1) - kv.pages(req.kv_len, 1)) * ps
            if extra > room:
                n, extra = 0, 0
            room -= extra
            budgets.append(n)
        return budgets

    def _verify_batch(self, table, reqs: list[Req], trees: list[DraftTree]) -> ForwardBatch:
        """The verify forward: TARGET_VERIFY with the trees' masks, or, when every tree is
        a chain (--speculative-topk 1), a causal EXTEND that returns every new token's
        logits (the same attention without building and checking dense masks)."""
        chains = all(tree.is_chain() for tree in trees)
        ids, pos, locs, masks, pre, ext = [], [], [], [], [], []
        for req, tree in zip(reqs, trees):
            start, n = req.kv_len, len(tree)
            ids.append(req.output_ids[-1])
            ids.extend(tree.tokens)
            pos.extend(start + d for d in tree.depths())
            locs.append(table[req.row, start : start + n + 1].to(torch.int64))
            if not chains:
                mask = torch.ones(n + 1, start + n + 1, dtype=torch.bool)
                mask[:, start:] = tree.ancestor_mask()
                masks.append(mask.flatten())
            pre.append(start)
            ext.append(n + 1)
        rows = [r.row for r in reqs]
        if not chains:
            return extend_batch(
                ForwardMode.TARGET_VERIFY, table, rows, ids, pos, locs, pre, ext, masks
            )
        fb = extend_batch(ForwardMode.EXTEND, table, rows, ids, pos, locs, pre, ext)
        fb.logits_indices = torch.arange(len(ids))
        return fb

    def _accept(self, reqs, trees, logits: torch.Tensor) -> list[tuple[list[int], int, int]]:
        """(accepted path, bonus token, first logits row) per request."""
        argmax = torch.argmax(logits, dim=-1).tolist()
        out, row = [], 0
        for req, tree in zip(reqs, trees):
            n = len(tree) + 1
            if req.params.is_greedy:
                path, bonus = accept_greedy(tree, argmax[row : row + n])
            else:
                path, bonus = accept_sampled(
                    tree, logits[row : row + n], req.params, _step_generator(req),
                    seed=req.seed, position=len(req.output_ids),
                )  # fmt: skip
            out.append((path, bonus, row))
            row += n
        return out

    def _commit(self, ctx: DecodeContext, reqs, starts, budgets, trees, accepted) -> DecodeResult:
        """Emit each request's accepted tokens, keep their KV, free the rest of the step's
        slots and tell the drafter; the result lists what each request emitted."""
        c = self.counters
        result = DecodeResult()
        verified: list[Verified] = []
        src, dst = [], []
        table = ctx.kv.table
        for req, start, tree, (path, bonus, row) in zip(reqs, starts, trees, accepted):
            tokens = [tree.tokens[j - 1] for j in path[1:]] + [bonus]
            emitted, reason = _emit(ctx.stop, req, tokens)
            m = len(emitted)
            keep = path[:m]
            for d in range(1, m):
                if keep[d] != d:
                    src.append(int(table[req.row, start + keep[d]]))
                    dst.append(int(table[req.row, start + d]))
            result.reqs.append(req)
            result.new_ids.append(emitted)
            result.reasons.append(reason)
            result.logprobs.append(None)
            result.decode_tokens += m
            c.verify_steps += 1
            c.emitted_tokens += m
            c.draft_tokens += len(tree)
            c.accepted_drafts += len(path) - 1
            req.spec_verify_steps += 1
            req.spec_emitted_tokens += m
            if reason is None:
                verified.append(Verified(req, start, keep, tree, [row + j for j in keep]))
        if src:
            self._copy_kv(torch.tensor(src), torch.tensor(dst))
        for req, start, n in zip(reqs, starts, budgets):
            ctx.kv.truncate(req, start + n + 1)
        t0 = time.perf_counter()
        self.drafter.after_verify(verified, self._hidden())
        self._observe_seconds = time.perf_counter() - t0
        return result

    _observe_seconds = 0.0

    def _copy_kv(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move accepted tree nodes' K/V (target and drafter) from `src` to `dst` slots."""
        self.runner.copy_kv_slots(src, dst)
        self.drafter.copy_slots(src, dst)

    def _hidden(self) -> torch.Tensor | None:
        """The target's hidden states of its last forward when the drafter reads them."""
        return self.runner.last_hidden() if self.drafter.needs_hidden else None


def _emit(stop: StopChecker, req: Req, tokens: list[int]) -> tuple[list[int], FinishReason | None]:
    """Append tokens one by one until a stop condition; kv_len follows the invariant
    kv_len == len(all_ids) - 1 at every check (the context limit reads it)."""
    emitted: list[int] = []
    for tok in tokens:
        req.output_ids.append(tok)
        req.kv_len = req.seq_len - 1
        emitted.append(tok)
        reason = stop.check(req, tok)
        if reason is not None:
            return emitted, reason
    return emitted, None


def _clip(tree: DraftTree, n: int) -> DraftTree:
    """The first n nodes of `tree` (still a tree: parents precede children)."""
    return tree if len(tree) <= n else DraftTree(tree.tokens[:n], tree.parents[:n])


def _step_generator(req: Req) -> torch.Generator:
    """The RNG of one speculative step: a function of the request's seed and output
    position (as the plain sampler's draws are), so a seeded request is reproducible."""
    seeds = torch.tensor([req.seed], dtype=torch.int64)
    positions = torch.tensor([len(req.output_ids)], dtype=torch.int64)
    return torch.Generator().manual_seed(int(row_keys(seeds, positions)[0]))
