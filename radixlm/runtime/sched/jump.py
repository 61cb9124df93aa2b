"""The scheduler side of jump-forward decoding (`runtime/sampling/jump_forward.py`), and
the drafts verified beside it in the plain forward path.

After a constrained request's token is chosen (and did not end it), `Drafts.propose`
drafts the text its grammar forces next or, where nothing is forced and the decode
strategy has a model-free lookup (n-gram speculation's prompt lookup), the lookup's
continuation cut where the grammar stops accepting it. An unconstrained request that
rides along in a mixed step (decoding beside a prefill, where the speculative strategy
does not step it) drafts the strategy's lookup there (`riding_lookup`). In the request's
next forward, `Drafts.take`
turns it from a decode row (its newest token) into an extend row [newest token, *draft],
with logits at every position; `verify` then chooses the token at each position
exactly as a decode step would (grammar mask, the request's sampler and its draw for that
output position, stop checks) and keeps drafted tokens while the chosen ones agree. The
first chosen token that differs from the draft (or the one after a fully kept draft) is
emitted too, and the KV of the dropped draft positions is freed. Between steps the usual
invariant holds: kv_len == len(all_ids) - 1, and the matcher has accepted output_ids.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from radixlm.runtime.sampling.grammar import GrammarBackend
from radixlm.runtime.sampling.jump_forward import JumpForward, accepted_prefix
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.kv_ledger import KVLedger
from radixlm.runtime.sched.request import Req
from radixlm.runtime.sched.stop import StopChecker


class Drafts:
    """Pending drafts of decoding constrained requests, and riding requests' lookups.

    Args:
        jumper: drafts a grammar's forced continuation; None: no jump-forward drafts.
        context_len: tokens per request at most (drafts stay inside it).
        lookup: a model-free draft of a request's continuation (`Drafter.lookup`), tried
            where the grammar forces nothing; None: forced text only.
        riding: the decode strategy's `riding_lookup`: drafts for the unconstrained
            requests decoding in a mixed step ([] for one it would not speculate); None:
            none.

    Attributes:
        lookup_drafted / lookup_accepted: lookup draft tokens of constrained requests
            proposed (after the grammar cut) and kept after verification, so far.
        riding_drafted / riding_accepted: the same for riding requests' drafts.
    """

    def __init__(
        self,
        jumper: JumpForward | None,
        context_len: int,
        lookup: Callable[[Req], list[int]] | None = None,
        riding: Callable[[Req], list[int]] | None = None,
    ):
        self.jumper = jumper
        self.context_len = context_len
        self.lookup = lookup
        self.riding = riding
        self.lookup_drafted = self.lookup_accepted = 0
        self.riding_drafted = self.riding_accepted = 0
        # req -> (len(output_ids) when drafted, draft, whether lookup drafted it). A
        # draft waits while its request is not decoding (an extend step without decodes,
        # a retraction: its output and matcher are unchanged); one whose request has
        # emitted since is stale. Weak keys: a finished request's draft goes with it.
        self._drafts: weakref.WeakKeyDictionary[Req, tuple[int, list[int], bool]] = (
            weakref.WeakKeyDictionary()
        )
        self._taken_lookups: set[Req] = set()  # the last `take`'s lookup-drafted requests
        self._taken_riding: set[Req] = set()  # and its riding ones

    def propose(self, req: Req) -> None:
        """Draft the continuation after `req`'s newest token (forced text first, else, for
        a greedy request, the lookup's), if it has a grammar and asks for no logprobs (a
        drafted row has none)."""
        if req.grammar is None or req.return_logprob:
            return
        room = self._room(req)
        draft = self.jumper.draft(req.grammar, req.output_ids, room, req) if self.jumper else []
        from_lookup = False
        # Lookup drafts only for greedy rows: a sampled row's token at a free position is
        # drawn by inverse CDF from an extend row's logits, which may differ from a decode
        # step's in the last bits, enough to move a draw lying at a token boundary.
        if not draft and self.lookup is not None and room > 0 and req.params.is_greedy:
            guess = self.lookup(req)[:room]
            draft = guess[: accepted_prefix(req.grammar, guess)]
            from_lookup = True
            self.lookup_drafted += len(draft)
        if draft:
            self._drafts[req] = (len(req.output_ids), draft, from_lookup)

    def _room(self, req: Req) -> int:
        """Draft tokens `req` may verify: its new tokens after the next one, inside the
        context."""
        return min(req.remaining_new_tokens() - 1, self.context_len - req.seq_len - 1)

    def kept(self, req: Req, n: int) -> None:
        """Count `n` drafted tokens of `req` kept by `verify`."""
        if req in self._taken_riding:
            self.riding_accepted += n
        elif req in self._taken_lookups:
            self.lookup_accepted += n
        else:
            self.jumper.accepted += n

    def take(
        self, plan: list[tuple[Req, int]], decodes: list[Req], kv: KVLedger
    ) -> tuple[list[tuple[Req, int]], list[Req], dict[Req, list[int]]]:
        """Move the decoding requests with a current draft into the extend plan (their
        newest token + draft); returns ``(plan, decodes, {req: draft})``. Their drafts
        are consumed; none is used when the KV pool cannot hold the step. In a mixed step
        (`plan` not empty) an unconstrained request also drafts `riding`'s lookup."""
        self._taken_lookups, self._taken_riding = set(), set()
        free = [r for r in decodes if r.grammar is None] if plan and self.riding else []
        if not decodes or not (self._drafts or free):
            return plan, decodes, {}
        drafts = self.riding(free) if free else []
        guesses = {r: g[: max(self._room(r), 0)] for r, g in zip(free, drafts)}
        drafted: dict[Req, list[int]] = {}
        lookups: set[Req] = set()
        riding: set[Req] = set()
        rest: list[Req] = []
        for r in decodes:
            entry = self._drafts.pop(r, None)
            if entry is not None and entry[0] == len(r.output_ids):
                drafted[r] = entry[1]
                if entry[2]:
                    lookups.add(r)
            elif guesses.get(r):
                drafted[r] = guesses[r]
                riding.add(r)
            else:
                rest.append(r)
        if not drafted:
            return plan, decodes, {}
        extends = plan + [(r, 1 + len(d)) for r, d in drafted.items()]
        pages = sum(kv.pages(r.kv_len, n) for r, n in extends)
        if pages * kv.page_size + kv.decode_tokens(rest) > kv.room():
            return plan, decodes, {}
        self._taken_lookups, self._taken_riding = lookups, riding
        self.riding_drafted += sum(len(drafted[r]) for r in riding)
        return extends, rest, drafted


def verify(
    req: Req,
    rows: torch.Tensor,
    draft: list[int],
    grammars: GrammarBackend,
    sampler: Sampler,
    stop: StopChecker,
    kv: KVLedger,
) -> tuple[list[int], FinishReason | None, int]:
    """Choose `req`'s tokens from the logits of its extend row [newest token, *draft].

    Args:
        rows: float [len(draft) + 1, vocab]; row j predicts the token after draft[:j].
            Masked in place.
        draft: the drafted tokens; req.kv_len already counts them (the forward ran).

    Returns the emitted tokens (appended to output_ids), the finish reason they reached
    and how many drafted tokens were kept. Sets kv_len to the positions kept and frees
    the pages past them.
    """
    start = req.seq_len - 1  # the newest token's position
    new: list[int] = []
    reason = None
    kept = 0
    for j in range(len(draft) + 1):
        row = rows[j : j + 1]
        grammars.apply(row, [req])
        tok = int(sampler.sample(row, [req])[0])
        req.output_ids.append(tok)
        new.append(tok)
        req.kv_len = start + 1 + j  # as after a decode step that chose `tok`
        done = grammars.accept(req, tok)
        reason = stop.check(req, tok)
        if done:
            reason = FinishReason.STOP
        if reason is not None or j == len(draft) or tok != draft[j]:
            break
        kept += 1
    kv.truncate(req, start + 1 + len(draft))
    return new, reason, kept
