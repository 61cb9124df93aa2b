"""One forward of the scheduler's own steps: build the batch, run the model, sample.

`ForwardStep.run` turns the planned prefill chunks and the decoding requests into one
`ForwardBatch` (allocating their KV slots through the ledger), runs the model, samples the
next token of every request whose prompt is complete (grammar masks first, logprobs from
the raw logits) and appends it with the grammar and stop checks. It changes only the
batch's requests and their KV slots and returns a `DecodeResult`; the `Scheduler` commits
it, or fails the batch when this raises.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.runtime.executor.batch import extend_batch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.sampling.grammar import GrammarBackend
from radixlm.runtime.sampling.logprobs import LogitsSelection, next_position_only, output_logprobs
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sched.admission import Plan
from radixlm.runtime.sched.decode import DecodeResult
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.jump import Drafts, verify
from radixlm.runtime.sched.kv_ledger import KVLedger
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.stop import StopChecker


class ForwardStep:
    """Runs extend, mixed and plain decode forwards for the Scheduler.

    Args:
        runner: the model runner. kv: the KV ledger (slots, the request-to-token table).
        sampler, grammars, stop: how tokens are drawn, masked and checked.
        after_forward: called as after_forward(fb, batch, {req: sampled token}) after
            every forward (the scheduler passes it on to its decode strategy).
        drafts: jump-forward drafts of constrained requests (`jump.py`); None: off.
    """

    def __init__(
        self,
        runner: ModelRunner,
        kv: KVLedger,
        sampler: Sampler,
        grammars: GrammarBackend,
        stop: StopChecker,
        after_forward: Callable[[ForwardBatch, list[Req], dict[Req, int]], None],
        drafts: Drafts | None = None,
    ):
        self.runner = runner
        self.kv = kv
        self.sampler = sampler
        self.grammars = grammars
        self.stop = stop
        self.after_forward = after_forward
        self.drafts = drafts

    def run(self, plan: Plan, decodes: list[Req]) -> DecodeResult:
        """One forward: the planned prefill chunks (EXTEND; decodes ride along in mixed
        steps) or, with an empty plan, one token for each of `decodes` (DECODE); samples
        and appends the next token of every request whose prompt is complete. Changes only
        the batch's requests and their KV slots; the caller commits the result (or fails
        the batch when this raises). A decoding request with a jump-forward draft runs as
        an extend row [newest token, *draft] and is verified (`jump.py`)."""
        drafted: dict[Req, list[int]] = {}
        if self.drafts is not None:
            plan, decodes, drafted = self.drafts.take(plan, decodes, self.kv)
        mode = ForwardMode.EXTEND if plan else ForwardMode.DECODE
        batch = [r for r, _ in plan] + decodes
        ids, positions, locs, ext_lens, pre_lens = [], [], [], [], []
        select = LogitsSelection(plan + [(r, 1) for r in decodes], drafted)
        for req, n in plan:
            start = req.kv_len
            locs.append(self.kv.alloc(req, start, n))
            if drafted and req in drafted:
                ids.extend([req.output_ids[-1], *drafted[req]])
            else:
                ids.extend(req.all_ids[start : start + n])
            positions.extend(range(start, start + n))
            ext_lens.append(n)
            pre_lens.append(start)
        if decodes:  # one token each: one slot allocation for all of them
            locs.append(self.kv.alloc_decode(decodes))
            ids.extend(r.output_ids[-1] for r in decodes)
            pre_lens.extend(r.kv_len for r in decodes)
            positions.extend(pre_lens[len(plan) :])
            ext_lens.extend([1] * len(decodes))
        fb = self._batch(mode, batch, ids, positions, locs, pre_lens, ext_lens)
        fb.logits_indices = select.indices
        fb.argmax_only = all(r.argmax_only for r in batch)
        out = self.runner.forward(fb)
        select.collect_prompt_logprobs(out)
        # Rows whose prompt is complete sample a token; a partial chunk samples nothing (nor
        # does a drafted row here: its kv_len runs past seq_len until `_verify`).
        done = [i for i, r in enumerate(batch) if r.kv_len == r.seq_len]
        rows = [select.last_rows[i] for i in done]
        # A decode step samples every row in order: use the logits without a copy.
        logits = out if rows == list(range(out.shape[0])) else out[rows]
        sampled = [batch[i] for i in done]
        next_ids, logprobs = self._sample(logits, sampled)
        self.after_forward(fb, batch, dict(zip(sampled, next_ids)))
        result = self._emit(sampled, next_ids, logprobs, decode_tokens=len(decodes))
        if drafted:
            self._verify(out, select.first_rows, drafted, result)
        return result

    def _verify(self, out: torch.Tensor, first_rows: dict, drafted: dict, result) -> None:
        """Choose the tokens of each drafted row (`jump.verify`) and add them to `result`."""
        for req, draft in drafted.items():
            row = first_rows[req]
            rows = out[row : row + len(draft) + 1]
            new, reason, kept = verify(
                req, rows, draft, self.grammars, self.sampler, self.stop, self.kv
            )
            self.drafts.kept(req, kept)
            if reason is None:
                self.drafts.propose(req)
            result.reqs.append(req)
            result.new_ids.append(new)
            result.reasons.append(reason)
            result.logprobs.append(None)
            result.decode_tokens += len(new)

    def _sample(self, logits: torch.Tensor, reqs: list[Req]) -> tuple[list[int], list]:
        """Next token of each request, and its logprobs (None unless return_logprob) from
        the raw logits: a grammar mask (applied in place) must not reach them."""
        if not reqs:
            return [], []
        masked_logprobs = any(r.return_logprob and r.grammar is not None for r in reqs)
        raw = logits.clone() if masked_logprobs else logits
        self.grammars.apply(logits, reqs)
        next_ids = self.sampler.sample(logits, reqs)
        return next_ids.tolist(), output_logprobs(raw, next_ids, reqs)

    def _batch(self, mode, batch, ids, positions, locs, pre_lens, ext_lens) -> ForwardBatch:
        """The step's batch (see `extend_batch`); each request's kv_len advances by its
        new tokens."""
        for req, n in zip(batch, ext_lens):
            req.kv_len += n
        rows = [r.row for r in batch]
        return extend_batch(mode, self.kv.table, rows, ids, positions, locs, pre_lens, ext_lens)

    def _emit(
        self, reqs: list[Req], next_ids: list[int], logprobs: list, decode_tokens: int
    ) -> DecodeResult:
        """Append each request's sampled token and run the grammar and stop checks; a
        request with max_new_tokens == 0 finishes ("length") without one, returning only
        the top-k alternatives of that next position (`next_position_only`)."""
        result = DecodeResult(decode_tokens=decode_tokens)
        for req, tok, lp in zip(reqs, next_ids, logprobs):
            result.reqs.append(req)
            if req.params.max_new_tokens == 0:
                result.new_ids.append([])
                result.reasons.append(FinishReason.LENGTH)
                result.logprobs.append(next_position_only(lp))
                continue
            req.output_ids.append(tok)
            grammar_done = self.grammars.accept(req, tok)
            reason = self.stop.check(req, tok)
            if grammar_done:
                reason = FinishReason.STOP
            if reason is None and self.drafts is not None and req.grammar is not None:
                self.drafts.propose(req)
            result.new_ids.append([tok])
            result.reasons.append(reason)
            result.logprobs.append(lp)
        return result
