"""The per-step tensor bundle that the model and the attention backend read.

It carries only index tensors and lengths (no request objects), so `kernels/` stays
independent of the scheduler.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

import torch


class ForwardMode(enum.Enum):
    """What a forward step computes."""

    EXTEND = enum.auto()  # new prompt tokens after a (possibly empty) cached prefix
    DECODE = enum.auto()  # one new token per request
    TARGET_VERIFY = enum.auto()  # draft tokens (a chain or tree) after a cached prefix


@dataclass
class ForwardBatch:
    """Inputs of one forward step over B requests and T new tokens.

    Attributes:
        mode: EXTEND, DECODE or TARGET_VERIFY.
        input_ids: int64 [T] new tokens, grouped by request in batch order.
        positions: int64 [T] absolute position of each new token.
        out_cache_loc: int64 [T] KV slot each new token's K/V is written to.
        req_pool_indices: int64 [B] row of each request in the request-to-token table.
        seq_lens: int64 [B] tokens with KV after this step (prefix + new).
        extend_prefix_lens: int64 [B] tokens already in the KV cache before this step.
        extend_seq_lens: int64 [B] new tokens of each request (1 in DECODE).
        req_to_token: int32 [rows, context_len] the request-to-token table.
        custom_mask: TARGET_VERIFY only: bool [sum_b n_b * s_b], the concatenation over
            requests of each row-major [n_b, s_b] mask (n_b = extend_seq_lens[b] draft
            tokens, s_b = seq_lens[b] keys: prefix then drafts); True = may attend. The
            FlashInfer `custom_mask` layout.
        mask_indptr: TARGET_VERIFY only: int64 [B + 1] offset of each request's mask in
            `custom_mask` (exclusive prefix sum of n_b * s_b).
        logits_indices: EXTEND only: int64 [R] indices into the T new tokens whose logits
            the model returns (prompt logprobs); None = each request's last token.
        argmax_only: only the argmax of each returned row of logits is used (every
            request samples greedily with no logit processor, logprob or grammar): the
            model may return logits that are exact only where a row's argmax can be and
            approximate, below the row's largest exact logit, elsewhere
            (`PackedHead.argmax_logits`).
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    req_to_token: torch.Tensor
    custom_mask: torch.Tensor | None = None
    mask_indptr: torch.Tensor | None = None
    logits_indices: torch.Tensor | None = None
    argmax_only: bool = False

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.numel())

    def last_token_index(self) -> torch.Tensor:
        """int64 [B]: index into the T new tokens of each request's last token."""
        return torch.cumsum(self.extend_seq_lens, 0) - 1

    def logits_index(self) -> torch.Tensor:
        """int64 [R]: the new tokens whose logits an EXTEND step returns."""
        if self.logits_indices is not None:
            return self.logits_indices
        return self.last_token_index()

    def to(self, device: str | torch.device) -> ForwardBatch:
        """A copy with every tensor on `device` (host-to-device copies are non-blocking)."""
        non_blocking = torch.device(device).type == "cuda"
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device, non_blocking=non_blocking)
            moved[f.name] = value
        return ForwardBatch(**moved)


def tree_mask_indptr(extend_seq_lens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """int64 [B + 1] offsets of each request's [n_b, s_b] block in a flat custom mask."""
    sizes = (extend_seq_lens * seq_lens).to(torch.int64)
    return torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)])
