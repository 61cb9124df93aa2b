"""EAGLE drafter: drafts a tree with an `EagleHead` over the target's hidden states.

KV: the head's one layer keeps K/V in its own buffers indexed by the target's slots (like
the draft model: the shared allocator, table and radix cache govern them). Element p
(feature f_p, token t_{p+1}) lives in the slot of position p.

Sync:
* After every forward the scheduler runs (`observe`), the head consumes the new
  positions with the target's true features; the output of each request's last element
  predicts the token after its newest one (`_out[req]`, the root's draft distribution).
* During drafting, node j (depth d) is fed (o_parent, token_j) at position
  kv_len + d - 1 in node j's scratch slot, attending to the committed elements and its
  non-root ancestors; the root has no element of its own (its token was consumed by
  element kv_len - 1).
* After verification (`after_verify`) the accepted positions are recomputed with the
  target's true features from the verify forward, overwriting the scratch entries.
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

import torch

from radixlm.config import ServerArgs
from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.runtime.executor.memory import KVPool
from radixlm.runtime.sched.request import Req
from radixlm.runtime.speculative.base import DraftContext, Verified
from radixlm.runtime.speculative.eagle_head import WEIGHTS_NAME, EagleConfig, EagleHead
from radixlm.runtime.speculative.tree_draft import ModelTreeDrafter, _Growing, draft_kv

logger = logging.getLogger(__name__)


#: Heads shipped with radixlm, by target name (`--speculative-draft-path smollm2-135m`).
BUNDLED_HEADS = Path(__file__).resolve().parent / "heads"


def resolve_head_path(path: str | Path) -> Path:
    """A directory holding eagle.json, or the bundled head named `path`."""
    p = Path(path)
    if not p.is_dir() and (BUNDLED_HEADS / str(path)).is_dir():
        return BUNDLED_HEADS / str(path)
    return p


def load_eagle_head(path: str | Path, target) -> EagleHead:
    """Load a head saved by `radixlm train-eagle` (or a bundled head's name) for the
    radixlm model `target`.

    Raises FileNotFoundError (no eagle.json / weights) or ValueError when the head was
    trained for a target of another shape (hidden size, attention heads, head_dim, norm
    eps).
    """
    from safetensors.torch import load_file

    path = resolve_head_path(path)
    cfg = EagleConfig.read(path)
    check_head_fits(cfg, target, path)
    head = EagleHead(cfg, target.config, target.model.embed_tokens, target.lm_head)
    dtype = target.lm_head.weight.dtype
    state = {k: v.to(dtype) for k, v in load_file(path / WEIGHTS_NAME).items()}
    head.load_state_dict(state, strict=False)
    return head.to(target.lm_head.weight.device, dtype).eval()


def check_head_fits(cfg: EagleConfig, target, path: Path) -> None:
    """Raise ValueError naming every field where the head at `path` (trained for
    `cfg.base_model`) differs from the radixlm model `target`. The head's own layer is a
    plain pre-norm block whatever the target's layers are (q/k norms, windows, experts):
    it reads the target's features and shares its embedding and head, nothing else."""
    layer = target.model.layers[0]
    attn = layer.self_attn
    target_shape = {
        "hidden_size": target.config.hidden_size,
        "num_attention_heads": attn.num_heads,
        "num_key_value_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim,
        "rms_norm_eps": target.config.rms_norm_eps,
    }
    diffs = [
        f"{k}={getattr(cfg, k)} (target {v})"
        for k, v in target_shape.items()
        if getattr(cfg, k) != v
    ]
    if diffs:
        raise ValueError(
            f"the EAGLE head at {path} was trained for {cfg.base_model!r} and does not fit "
            f"this model: {', '.join(diffs)}"
        )


class EagleDrafter(ModelTreeDrafter):
    """Tree drafts from an EAGLE head (see the module docstring).

    Args:
        head: the loaded head. kv_pool: its one-layer KV buffers (target-sized slots).
        backend: attention backend over `kv_pool`. num_steps, topk: tree shape.
    """

    needs_hidden = True
    root_visible = False
    position_shift = -1

    def __init__(self, head: EagleHead, kv_pool: KVPool, backend, num_steps: int, topk: int):
        super().__init__(num_steps, topk)
        self.head = head
        self.kv_pool = kv_pool
        self.backend = backend
        self._out: weakref.WeakKeyDictionary[Req, torch.Tensor] = weakref.WeakKeyDictionary()
        self._node_out: dict[tuple[int, int], torch.Tensor] = {}

    @classmethod
    def load(cls, args: ServerArgs, runner) -> EagleDrafter:
        """Load the head at --speculative-draft-path for the runner's model."""
        head = load_eagle_head(args.speculative_draft_path, runner.model)
        attn = head.layer.self_attn
        pool, backend = draft_kv(args, runner, [attn])
        logger.info("EAGLE head %s loaded", args.speculative_draft_path)
        return cls(head, pool, backend, args.speculative_num_steps, args.speculative_topk)

    @torch.inference_mode()
    def _run(self, fb: ForwardBatch, features: torch.Tensor) -> torch.Tensor:
        device = self.head.fc.weight.device
        if device.type != "cpu":
            fb = fb.to(device)
        self.backend.init_forward_metadata(fb)
        return self.head(fb, self.backend, features.to(device))

    def _extend(self, table, rows, starts, tokens, features) -> torch.Tensor:
        """Head elements at positions starts[i] .. of each request (tokens[i] = the t_{p+1}
        list); returns the output of each request's last element [B, H]."""
        lens = [len(t) for t in tokens]
        pre = torch.tensor(starts, dtype=torch.int64)
        ext = torch.tensor(lens, dtype=torch.int64)
        fb = ForwardBatch(
            mode=ForwardMode.EXTEND,
            input_ids=torch.tensor([t for ts in tokens for t in ts], dtype=torch.int64),
            positions=torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens)]),
            out_cache_loc=torch.cat(
                [table[r, s : s + n].to(torch.int64) for r, s, n in zip(rows, starts, lens)]
            ),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64),
            seq_lens=pre + ext,
            extend_prefix_lens=pre,
            extend_seq_lens=ext,
            req_to_token=table,
        )
        out = self._run(fb, features)
        return out[fb.last_token_index().to(out.device)]

    def observe(self, fb, reqs, next_ids, hidden) -> None:
        """Consume the positions the target just computed (hidden: [T, H] features)."""
        if hidden is None:
            return
        rows, starts, tokens, keep = [], [], [], []
        for req, pre, n in zip(reqs, fb.extend_prefix_lens.tolist(), fb.extend_seq_lens.tolist()):
            ids = req.all_ids + ([next_ids[req]] if req in next_ids else [])
            if pre + n >= len(ids):  # the token after the last position is not known
                n -= 1
            rows.append(req.row)
            starts.append(pre)
            tokens.append(ids[pre + 1 : pre + n + 1])
            keep.append(n)
        sel = torch.cat([torch.arange(o, o + k) for o, k in zip(_offsets(fb), keep)])
        if sel.numel() == 0:
            return
        live = [i for i, k in enumerate(keep) if k > 0]
        last = self._extend(
            fb.req_to_token,
            [rows[i] for i in live],
            [starts[i] for i in live],
            [tokens[i] for i in live],
            hidden[sel.to(hidden.device)],
        )
        for j, i in enumerate(live):
            self._out[reqs[i]] = last[j]

    def _root_logits(self, ctx: DraftContext, grows: list[_Growing]) -> torch.Tensor:
        h = self.head.fc.out_features
        dev = self.head.fc.weight.device
        outs = [self._out.get(g.req, torch.zeros(h, device=dev)) for g in grows]
        with torch.inference_mode():
            self._roots = {id(g): o for g, o in zip(grows, outs)}
            self._node_out = {}
            return self.head.logits(torch.stack(outs)).cpu()

    def _node_logits(self, fb: ForwardBatch, grows, new) -> torch.Tensor:
        feats = []
        for g, r in zip(grows, new):
            for j in r:
                parent = g.tree.parents[j - 1]
                key = (id(g), parent)
                feats.append(self._roots[id(g)] if parent == 0 else self._node_out[key])
        out = self._run(fb, torch.stack(feats))
        i = 0
        for g, r in zip(grows, new):
            for j in r:
                self._node_out[(id(g), j)] = out[i]
                i += 1
        with torch.inference_mode():
            return self.head.logits(out).cpu()

    def after_verify(self, results: list[Verified], hidden) -> None:
        """Recompute the accepted positions with the target's true features."""
        self._node_out, self._roots = {}, {}
        if not results or hidden is None:
            return
        rows = [v.req.row for v in results]
        starts = [v.start for v in results]
        tokens = [v.req.output_ids[-len(v.path) :] for v in results]
        sel = torch.tensor([r for v in results for r in v.hidden_rows], device=hidden.device)
        last = self._extend(self.table, rows, starts, tokens, hidden[sel])
        for v, o in zip(results, last):
            self._out[v.req] = o


def _offsets(fb: ForwardBatch) -> list[int]:
    return (torch.cumsum(fb.extend_seq_lens, 0) - fb.extend_seq_lens).tolist()
