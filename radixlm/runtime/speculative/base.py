"""The drafter interface and the draft-tree data type of speculative decoding.

A drafter proposes, for each running request, a tree of draft tokens that continue the
request's sequence; the target model then scores the whole tree in one TARGET_VERIFY
forward, or a causal EXTEND when every tree is a chain (`runtime/speculative/decode.py`).
Node 0 of every tree is the root: the request's last token, which has no KV yet. Drafts
are nodes 1..n, each with a parent of smaller index (topological order), so node j sits
at depth(j) below the root.

Slots: before drafting, the caller allocates n_max + 1 KV slots for each request at
table positions kv_len .. kv_len + n_max of its row; node j owns the slot at position
kv_len + j while the step runs. A drafter with its own KV (a draft model, an EAGLE head)
keeps it in its own buffers indexed by the same slots, so the shared allocator, the
request-to-token table and the radix cache govern both.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import torch

from radixlm.kernels import ForwardBatch
from radixlm.runtime.sched.request import Req


@dataclass
class DraftTree:
    """Draft tokens of one request as a tree rooted at its last token.

    Attributes:
        tokens: token id of nodes 1..n (tokens[j - 1] is node j's token).
        parents: parent node of nodes 1..n (parents[j - 1] < j; 0 is the root).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        """A single path: node j's parent is node j - 1."""
        return cls(list(tokens), list(range(len(tokens))))

    @classmethod
    def from_sequences(cls, seqs: list[list[int]], max_nodes: int) -> DraftTree:
        """Merge candidate continuations into a trie (shared prefixes become one path),
        keep at most `max_nodes` nodes in breadth-first order (earlier sequences first)."""
        children: list[dict[int, int]] = [{}]
        tokens: list[int] = []
        parents: list[int] = []
        depth = 0
        while len(tokens) < max_nodes:
            grown = False
            for seq in seqs:
                if depth >= len(seq) or len(tokens) >= max_nodes:
                    continue
                node = 0
                for tok in seq[:depth]:
                    node = children[node].get(tok, -1)
                    if node < 0:
                        break
                if node < 0 or seq[depth] in children[node]:
                    continue
                tokens.append(seq[depth])
                parents.append(node)
                children[node][seq[depth]] = len(tokens)
                children.append({})
                grown = True
            depth += 1
            if not grown and all(depth > len(s) for s in seqs):
                break
        return cls(tokens, parents)

    def is_chain(self) -> bool:
        """Whether every node's parent is the node before it (a single path; empty too)."""
        return all(p == j for j, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of nodes 0..n (the root has depth 0)."""
        d = [0]
        for p in self.parents:
            d.append(d[p] + 1)
        return d

    def children(self) -> list[list[int]]:
        """Children of nodes 0..n, in node order."""
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for j, p in enumerate(self.parents, start=1):
            kids[p].append(j)
        return kids

    def ancestor_mask(self) -> torch.Tensor:
        """bool [n + 1, n + 1]: entry [i, j] is True when node j is node i or its ancestor."""
        n = len(self.tokens) + 1
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[0, 0] = True
        for j, p in enumerate(self.parents, start=1):
            mask[j] = mask[p]
            mask[j, j] = True
        return mask


@dataclass
class DraftContext:
    """What a drafter sees of one speculative step.

    Attributes:
        reqs: the requests drafting this step (kv_len == len(all_ids) - 1 for each).
        budgets: draft tokens allowed per request (0: verify the root only).
        table: int32 request-to-token table; node j of request i owns slot
            table[reqs[i].row, reqs[i].kv_len + j] for j <= budgets[i].
    """

    reqs: list[Req]
    budgets: list[int]
    table: torch.Tensor


@dataclass
class Verified:
    """Outcome of one verify step for one request, handed back to the drafter.

    Attributes:
        req: the request (its kv_len and output_ids already advanced).
        start: kv_len before the step (position of the root).
        path: accepted nodes, root first, kept in KV (len = tokens emitted this step).
        tree: the verified draft tree.
        hidden_rows: indices into the verify forward's T tokens of the `path` nodes.
    """

    req: Req
    start: int
    path: list[int]
    tree: DraftTree
    hidden_rows: list[int]


class Drafter(abc.ABC):
    """Proposes draft trees; keeps any state of its own in sync with the target.

    Implementations: `NgramDrafter` (prompt lookup), `DraftModelDrafter` (a smaller
    model), `EagleDrafter` (a feature-level head over the target's hidden states).
    """

    #: Whether the drafter reads the target's last hidden states (the runner captures them).
    needs_hidden: bool = False
    #: Whether `observe` keeps state per forwarded position (a draft model's KV, EAGLE's
    #: features). Jump-forward rows forward positions that their verify may drop, so
    #: they run only beside drafters without such state (`SpeculativeDecode`).
    tracks_positions: bool = False

    @abc.abstractmethod
    def draft(self, ctx: DraftContext) -> list[DraftTree]:
        """One tree per request with at most ctx.budgets[i] nodes (root excluded)."""

    def available(self, req: Req) -> int | None:
        """The most draft nodes `draft` can propose for `req` this step, or None where it
        fills any budget (the default: a drafter that runs a model). Called just before
        `draft` in the same step where the budget plans `within_available`, so that rows
        a request cannot fill (no n-gram match) go to the requests that can."""
        return None

    def observe(  # noqa: B027 - optional hook
        self, fb: ForwardBatch, reqs: list[Req], next_ids: dict[Req, int], hidden
    ) -> None:
        """Called after every non-speculative target forward (extend, mixed, plain decode).

        Args:
            fb: the forward batch (reqs in its order; kv_len already advanced).
            reqs: the batch's requests.
            next_ids: the token sampled for each request that sampled one.
            hidden: float [T, hidden] target last hidden states of fb's tokens, or None.
        """

    def after_verify(self, results: list[Verified], hidden) -> None:  # noqa: B027
        """Called after a verify step with each request's accepted path (default: nothing).

        hidden: float [T, hidden] target hidden states of the verify forward, or None.
        """

    def lookup(self, req: Req) -> list[int]:
        """A linear draft of `req`'s next tokens made without running a model, or []
        (the default). Constrained requests, which decode in the plain step, verify it
        there where their grammar forces nothing (`runtime/sched/jump.py`); only
        drafters without `tracks_positions` are asked."""
        return []

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:  # noqa: B027
        """Copy the drafter's own KV from slots `src` to `dst` (int64 [k]) (default: none)."""

    def stats(self) -> dict[str, int | float]:
        """Drafter-specific counters (default: none)."""
        return {}
