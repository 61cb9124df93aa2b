"""The per-step tensor bundle that the model and the attention backend read.

It carries only index tensors and lengths (no request objects), so `kernels/` stays
independent of the scheduler.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    """What a forward step computes."""

    EXTEND = enum.auto()  # new prompt tokens after a (possibly empty) cached prefix
    DECODE = enum.auto()  # one new token per request


@dataclass
class ForwardBatch:
    """Inputs of one forward step over B requests and T new tokens.

    Attributes:
        mode: EXTEND or DECODE.
        input_ids: int64 [T] new tokens, grouped by request in batch order.
        positions: int64 [T] absolute position of each new token.
        out_cache_loc: int64 [T] KV slot each new token's K/V is written to.
        req_pool_indices: int64 [B] row of each request in the request-to-token table.
        seq_lens: int64 [B] tokens with KV after this step (prefix + new).
        extend_prefix_lens: int64 [B] tokens already in the KV cache before this step.
        extend_seq_lens: int64 [B] new tokens of each request (1 in DECODE).
        req_to_token: int32 [rows, context_len] the request-to-token table.
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

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.numel())

    def last_token_index(self) -> torch.Tensor:
        """int64 [B]: index into the T new tokens of each request's last token."""
        return torch.cumsum(self.extend_seq_lens, 0) - 1
