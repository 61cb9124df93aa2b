"""Growing a draft tree with a small autoregressive model (draft model, EAGLE head).

`ModelTreeDrafter.draft` expands every request's tree level by level (EAGLE-2-style
dynamic tree, Li et al. 2024): at depth d each frontier node offers its `topk` most likely
next tokens, scored by the cumulative draft log-probability of its path; the best
`topk` of all offers (within the request's node budget) become the next level, and one
batched forward of the small model over the new nodes (tree mask: prefix plus ancestors)
yields their next-token logits. With topk == 1 this is a greedy chain.

Draft tokens are chosen deterministically (top-k), which is what the rejection sampler
in `accept.py` assumes.
"""

from __future__ import annotations

import abc

import torch

from radixlm.kernels import ForwardBatch, ForwardMode, create_attention_backend
from radixlm.runtime.executor.batch import extend_batch
from radixlm.runtime.executor.memory import KVPool
from radixlm.runtime.speculative.base import DraftContext, Drafter, DraftTree


def draft_kv(args, runner, attns: list, new_pool=None) -> tuple[KVPool, object]:
    """A drafter's own K/V pool, slot-aligned with the target's, and its attention backend.

    Args:
        args: ServerArgs (page_size).
        runner: the target's ModelRunner (pool size, KV dtype, device, backend name).
        attns: the drafter's attention modules, one per layer (num_heads, num_kv_heads,
            head_dim, scaling, sliding_window; the first one's shape for all).
        new_pool: new_pool(num_slots, dtype, device, padding_slots) -> the pool, where the
            drafter is a model with its own cache layout (`CausalLM.create_kv_pool`: a
            latent pool for MLA); None for a `KVPool` of the attention modules' shape.

    Returns:
        (pool, backend): a pool with as many slots as the target's, and an attention
        backend over it with the drafter's scale and sliding windows.
    """
    attn, num_layers = attns[0], len(attns)
    num_slots, dtype = runner.kv_pool.k_buffer[0].shape[0], runner.kv_pool.dtype
    if new_pool is not None:
        pool = new_pool(num_slots, dtype, runner.device, args.page_size)
    else:
        pool = KVPool(
            num_slots,
            num_layers,
            attn.num_kv_heads,
            attn.head_dim,
            dtype,
            runner.device,
            padding_slots=args.page_size,
        )
    backend = create_attention_backend(
        runner.attention_backend,
        pool,
        attn.scaling,
        num_heads=attn.num_heads,
        page_size=args.page_size,
        dtype=runner.dtype,
        sliding_windows=[a.sliding_window for a in attns],
    )
    return pool, backend


class _Growing:
    """A tree under construction for one request (node 0 = root)."""

    def __init__(self, req, budget: int):
        self.req = req
        self.budget = budget
        self.tree = DraftTree()
        self.scores = [0.0]
        self.frontier = [0]
        self.forwarded = [0]  # nodes whose draft KV this step wrote (root first)


class ModelTreeDrafter(Drafter):
    """Base of drafters that run a small causal model over the request's slots.

    Subclasses implement `_root_logits` (the distribution after the root, catching the
    drafter's own KV up to the root) and `_node_logits` (one forward over new nodes).

    Args:
        num_steps: tree depth. topk: tree width.
    """

    #: Whether node forwards attend to the root's slot; and the offset added to node
    #: positions (EAGLE feeds node j at kv_len + depth - 1 and keeps no root entry).
    root_visible = True
    position_shift = 0
    tracks_positions = True  # the drafter's own KV follows the target's positions

    def __init__(self, num_steps: int, topk: int):
        self.num_steps = num_steps
        self.topk = topk

    @abc.abstractmethod
    def _root_logits(self, ctx: DraftContext, grows: list[_Growing]) -> torch.Tensor:
        """float32 [len(grows), vocab]: draft logits of the token after each root."""

    @abc.abstractmethod
    def _node_logits(self, fb: ForwardBatch, grows: list[_Growing], new: list[range]):
        """float32 [T, vocab] draft logits of the new nodes `new[i]` of each tree, from
        `fb` (TARGET_VERIFY over those nodes; see `_node_batch`)."""

    def draft(self, ctx: DraftContext) -> list[DraftTree]:
        self.table = ctx.table  # the request-to-token table, read again in after_verify
        grows = {i: _Growing(r, n) for i, (r, n) in enumerate(zip(ctx.reqs, ctx.budgets)) if n}
        active = list(grows.values())
        if active:
            self._grow(ctx, active)
        self._last = active
        return [grows[i].tree if i in grows else DraftTree() for i in range(len(ctx.reqs))]

    def _grow(self, ctx: DraftContext, grows: list[_Growing]) -> None:
        logits = self._root_logits(ctx, grows)
        rows = {id(g): [0] for g in grows}  # logits row of each frontier node
        offset = {id(g): i for i, g in enumerate(grows)}
        for depth in range(1, self.num_steps + 1):
            logp = torch.log_softmax(logits.float(), dim=-1)
            top_lp, top_tok = torch.topk(logp, self.topk, dim=-1)
            top_lp, top_tok = top_lp.tolist(), top_tok.tolist()
            new: list[range] = []
            growing = []
            for g in grows:
                room = g.budget - len(g.tree)
                offers = []
                for f, row in zip(g.frontier, rows[id(g)]):
                    r = offset[id(g)] + row
                    for lp, tok in zip(top_lp[r], top_tok[r]):
                        offers.append((g.scores[f] + lp, f, tok))
                offers.sort(key=lambda o: -o[0])
                first = len(g.tree) + 1
                for score, parent, tok in offers[: min(self.topk, room)]:
                    g.tree.tokens.append(tok)
                    g.tree.parents.append(parent)
                    g.scores.append(score)
                g.frontier = list(range(first, len(g.tree) + 1))
                if g.frontier and depth < self.num_steps and len(g.tree) < g.budget:
                    growing.append(g)
                    new.append(range(first, len(g.tree) + 1))
            if not growing:
                return
            fb = self._node_batch(ctx, growing, new)
            logits = self._node_logits(fb, growing, new)
            start = 0
            for g, r in zip(growing, new):
                g.forwarded.extend(r)
                offset[id(g)] = start
                rows[id(g)] = list(range(len(r)))
                start += len(r)
            grows = growing

    def _node_batch(
        self, ctx: DraftContext, grows: list[_Growing], new: list[range]
    ) -> ForwardBatch:
        """TARGET_VERIFY batch over nodes new[i] of each tree: node j at slot
        table[row, kv_len + j], position kv_len + depth(j); keys are the prefix and the
        nodes before it in the row, masked to the prefix and the node's ancestors."""
        ids, pos, locs, masks, pre, ext = [], [], [], [], [], []
        for g, r in zip(grows, new):
            req, start = g.req, g.req.kv_len
            depths = g.tree.depths()
            anc = g.tree.ancestor_mask()
            ids.extend(g.tree.tokens[j - 1] for j in r)
            pos.extend(start + depths[j] + self.position_shift for j in r)
            locs.append(ctx.table[req.row, start + r.start : start + r.stop].to(torch.int64))
            mask = torch.ones(len(r), start + r.stop, dtype=torch.bool)
            mask[:, start:] = anc[r.start : r.stop, : r.stop]
            mask[:, start] = self.root_visible
            masks.append(mask.flatten())
            pre.append(start + r.start)
            ext.append(len(r))
        rows = [g.req.row for g in grows]
        return extend_batch(
            ForwardMode.TARGET_VERIFY, ctx.table, rows, ids, pos, locs, pre, ext, masks
        )
