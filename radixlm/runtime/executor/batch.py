"""Forward-batch construction: the `ForwardBatch` of one step from per-request pieces."""

from __future__ import annotations

import torch

from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.kernels.forward_batch import tree_mask_indptr


def extend_batch(
    mode: ForwardMode,
    table: torch.Tensor,
    rows: list[int],
    ids: list[int],
    pos: list[int],
    locs: list[torch.Tensor],
    pre: list[int],
    ext: list[int],
    masks: list[torch.Tensor] | None = None,
) -> ForwardBatch:
    """Build an EXTEND-shaped batch (EXTEND or TARGET_VERIFY) from per-request pieces.

    Args:
        mode: the forward mode of the batch.
        table: req_to_token table, int32 [rows, max_len].
        rows: the table row of each request.
        ids, pos: token ids and positions of every new token, requests in order.
        locs: per request, the KV slots (int64 [ext_i]) the new tokens write.
        pre, ext: per request, the cached prefix length and the number of new tokens.
        masks: per request, a flattened bool mask [ext_i * (pre_i + ext_i)] (keys the
            new tokens may see); with it the batch carries custom_mask and mask_indptr.
    """
    pre_t = torch.tensor(pre, dtype=torch.int64)
    ext_t = torch.tensor(ext, dtype=torch.int64)
    extra = {}
    if masks is not None:
        extra = {
            "custom_mask": torch.cat(masks),
            "mask_indptr": tree_mask_indptr(ext_t, pre_t + ext_t),
        }
    return ForwardBatch(
        mode=mode,
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        out_cache_loc=torch.cat(locs),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=pre_t + ext_t,
        extend_prefix_lens=pre_t,
        extend_seq_lens=ext_t,
        req_to_token=table,
        **extra,
    )
