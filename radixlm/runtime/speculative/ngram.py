"""N-gram (prompt lookup) drafter: continue the sequence the way it continued before.

For the last k tokens of a request (k from `max_ngram` down to `min_ngram`), find their
most recent earlier occurrences in the request's own tokens (prompt + output) and propose
the tokens that followed them. Up to `topk` distinct continuations become the branches of
a draft tree. No model and no training: it pays on inputs that copy text (code edits,
quoting documents, agent tool loops). After Saxena 2023 ("prompt lookup decoding") and
the n-gram speculator of vLLM / SGLang.

Each request keeps an index {k-gram -> end positions} updated incrementally with the
tokens appended since its last draft (amortised O(k) per token).
"""

from __future__ import annotations

import weakref

from radixlm.runtime.sched.request import Req
from radixlm.runtime.speculative.base import DraftContext, Drafter, DraftTree


class _Index:
    """k-gram -> positions just after each occurrence (ascending), for one request."""

    def __init__(self, ks: range):
        self.ks = ks
        self.seen = 0
        self.table: dict[tuple[int, ...], list[int]] = {}

    def update(self, ids: list[int]) -> None:
        """Index occurrences ending before position len(ids) - 1 (the suffix itself must
        not match its own position)."""
        upto = len(ids) - 1
        for end in range(max(self.seen, 1), upto + 1):
            for k in self.ks:
                if end >= k:
                    self.table.setdefault(tuple(ids[end - k : end]), []).append(end)
        self.seen = max(self.seen, upto + 1)


class NgramDrafter(Drafter):
    """Prompt-lookup drafts.

    Args:
        num_steps: tokens per continuation (tree depth).
        topk: distinct continuations per request (tree width).
        max_ngram, min_ngram: lengths of the matched suffix, longest tried first.
    """

    def __init__(self, num_steps: int, topk: int, max_ngram: int = 4, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.num_steps = num_steps
        self.topk = topk
        self.ks = range(max_ngram, min_ngram - 1, -1)
        self._index: weakref.WeakKeyDictionary[Req, _Index] = weakref.WeakKeyDictionary()

    def available(self, req: Req) -> int:
        """Nodes of the trie of req's candidates (0: no match). `draft` looks them up
        again: the index is already current then, so that costs a few dict lookups."""
        return len(DraftTree.from_sequences(self.candidates(req), self.topk * self.num_steps))

    def draft(self, ctx: DraftContext) -> list[DraftTree]:
        return [
            DraftTree.from_sequences(self.candidates(req), n) if n else DraftTree()
            for req, n in zip(ctx.reqs, ctx.budgets)
        ]

    def lookup(self, req: Req) -> list[int]:
        """The best continuation (`candidates`' first), or []."""
        found = self.candidates(req)
        return found[0] if found else []

    def candidates(self, req: Req) -> list[list[int]]:
        """Up to `topk` distinct continuations of req's sequence, best (longest match,
        most recent) first; each num_steps tokens (a repeating tail is continued
        periodically past the sequence's end)."""
        ids = req.all_ids
        index = self._index.get(req)
        if index is None or index.seen > len(ids):  # new request (or ids were reset)
            index = self._index[req] = _Index(self.ks)
        index.update(ids)
        found: list[list[int]] = []
        for k in self.ks:
            if k > len(ids):
                continue
            for end in reversed(index.table.get(tuple(ids[-k:]), ())):
                cont = ids[end : end + self.num_steps]
                # A match that runs into the sequence's end overlaps the suffix: the text
                # repeats with period len(ids) - end, and the draft continues that period
                # (token j of the draft is token j of ids + draft after `end`).
                period = len(ids) - end
                while len(cont) < self.num_steps:
                    cont.append(cont[len(cont) - period])
                if cont and cont not in found:
                    found.append(cont)
                if len(found) >= self.topk:
                    return found
        return found
