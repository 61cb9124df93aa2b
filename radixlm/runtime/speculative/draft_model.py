"""Draft-model drafter: a smaller model with the target's tokenizer proposes the tree.

KV: the draft model keeps its own K/V buffers (`KVPool` with the draft's layer layout)
indexed by the *same* slots as the target's pool, sized like it. A slot allocated by the
shared allocator therefore holds both models' K/V of one token; the request-to-token
table, the radix cache, eviction and retraction govern both with no extra bookkeeping.
Cost: the draft's KV bytes per token are added to every cached token.

Sync: every forward the scheduler runs (prefill chunks, plain decode steps) is replayed
on the draft model (`observe`), so cached prefixes carry valid draft KV. Within a
speculative step the draft catches up from `dkv` (its valid length for the request) to
the root, then grows the tree (`tree_draft.py`). After verification the draft KV of the
accepted path's forwarded nodes is kept (they were computed under the path's own mask);
tokens past it are recomputed at the next catch-up. Stale draft KV can only lower
acceptance, never change outputs: the target alone decides every emitted token.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref

import torch

from radixlm.config import ServerArgs
from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.runtime.executor.batch import extend_batch
from radixlm.runtime.executor.memory import KVPool
from radixlm.runtime.sched.request import Req
from radixlm.runtime.speculative.base import DraftContext, Verified
from radixlm.runtime.speculative.tree_draft import ModelTreeDrafter, _Growing, draft_kv

logger = logging.getLogger(__name__)


class DraftModelDrafter(ModelTreeDrafter):
    """Drafts with a small causal LM (same tokenizer and vocabulary as the target).

    Args:
        model: a radixlm causal LM (`runtime/executor/models/`) on the target's device.
        kv_pool: the draft's KV buffers, slot-compatible with the target's pool.
        backend: an attention backend over `kv_pool`.
        num_steps, topk: tree depth and width.
        device: where the model runs (index tensors are moved there).
    """

    def __init__(self, model, kv_pool: KVPool, backend, num_steps: int, topk: int, device):
        super().__init__(num_steps, topk)
        self.model = model
        self.kv_pool = kv_pool
        self.backend = backend
        self.device = device
        self._dkv: weakref.WeakKeyDictionary[Req, int] = weakref.WeakKeyDictionary()
        self._last: list[_Growing] = []

    @classmethod
    def load(cls, args: ServerArgs, runner) -> DraftModelDrafter:
        """Load --speculative-draft-path like a target model and size its KV like the
        target's pool. Raises ValueError when the vocabularies differ."""
        from radixlm.runtime.executor.layers import TorchLayers
        from radixlm.runtime.executor.model_registry import local_hf_dir, read_hf_config
        from radixlm.runtime.executor.weights import load_model

        hf_dir = local_hf_dir(args.speculative_draft_path)
        config = read_hf_config(hf_dir)
        if config.vocab_size != runner.config.vocab_size:
            raise ValueError(
                f"draft model vocabulary ({config.vocab_size}) differs from the target's "
                f"({runner.config.vocab_size}); the draft must share the tokenizer"
            )
        model = load_model(hf_dir, config, runner.dtype, runner.device, TorchLayers())
        attns = [la.self_attn for la in model.model.layers]
        pool, backend = draft_kv(args, runner, attns, model.create_kv_pool)
        logger.info(
            "draft model %s: %d layers, KV %d bytes/token",
            args.speculative_draft_path,
            config.num_hidden_layers,
            pool.bytes_per_token,
        )
        return cls(model, pool, backend, args.speculative_num_steps, args.speculative_topk,
                   runner.device)  # fmt: skip

    # ---- running the draft model ---------------------------------------------------------

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        if str(self.device) != "cpu":
            fb = dataclasses.replace(fb, req_to_token=fb.req_to_token.to(self.device))
            fb = fb.to(self.device)
        self.backend.init_forward_metadata(fb)
        return self.model(fb, self.backend).cpu()

    def observe(self, fb, reqs, next_ids, hidden) -> None:
        """Replay the target's forward on the draft model (same slots and positions)."""
        self._forward(fb)
        for req, pre in zip(reqs, fb.extend_prefix_lens.tolist()):
            if self._dkv.get(req, pre) >= pre:  # contiguous: a new request trusts its cache
                self._dkv[req] = req.kv_len

    def _root_logits(self, ctx: DraftContext, grows: list[_Growing]) -> torch.Tensor:
        """Extend the draft KV from dkv through the root (position kv_len)."""
        ids, pos, locs, pre, ext = [], [], [], [], []
        for g in grows:
            req = g.req
            start = min(self._dkv.get(req, req.kv_len), req.kv_len)
            end = req.kv_len + 1
            ids.extend(req.all_ids[start:end])
            pos.extend(range(start, end))
            locs.append(ctx.table[req.row, start:end].to(torch.int64))
            pre.append(start)
            ext.append(end - start)
        rows = [g.req.row for g in grows]
        fb = extend_batch(ForwardMode.EXTEND, ctx.table, rows, ids, pos, locs, pre, ext)
        return self._forward(fb)

    def _node_logits(self, fb: ForwardBatch, grows, new) -> torch.Tensor:
        return self._forward(fb)

    def after_verify(self, results: list[Verified], hidden) -> None:
        """Keep the draft KV of the accepted path's leading forwarded nodes."""
        grown = {id(g.req): set(g.forwarded) for g in self._last}
        self._last = []
        for v in results:
            done = grown.get(id(v.req))
            if done is None:  # verified without drafting: nothing new written
                self._dkv[v.req] = min(self._dkv.get(v.req, v.start), v.start)
                continue
            kept = 0
            while kept < len(v.path) and v.path[kept] in done:
                kept += 1
            self._dkv[v.req] = v.start + kept

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.kv_pool.copy_slots(src.to(self.device), dst.to(self.device))
