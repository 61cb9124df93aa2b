"""Rank 0 sends each step to the other tensor-parallel ranks; they receive and replay it.

Rank 0 alone schedules: every forward, every KV slot copy (speculative decoding moves the
accepted drafts' K/V) and the shutdown go out as one fixed-size int64 header and one int64
payload, two broadcasts per step. A forward's payload carries the `ForwardBatch` index
tensors (input ids, positions, KV slots, table rows, lengths, the verify mask and the
logits rows) and the request-to-token table rows of the batch (its first max(seq_lens)
columns), which the receiving rank writes into its own table, so every rank indexes its
KV pool with the same slots. Sampling stays on rank 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.runtime.executor.parallel.group import TPGroup


class Op(enum.IntEnum):
    """What a broadcast step asks the other ranks to do."""

    FORWARD = 0
    COPY_SLOTS = 1
    SHUTDOWN = 2


_MODES = list(ForwardMode)
#: op, mode, tokens T, requests B, table columns, mask length, mask_indptr length,
#: logits rows (-1: None), argmax_only.
_HEADER = 9


@dataclass
class Step:
    """One received step: `fb` for FORWARD, `src`/`dst` (int64 [n]) for COPY_SLOTS."""

    op: Op
    fb: ForwardBatch | None = None
    src: torch.Tensor | None = None
    dst: torch.Tensor | None = None


def _send(group: TPGroup, header: list[int], payload: list[torch.Tensor]) -> None:
    flat = [t.reshape(-1).to(torch.int64) for t in payload]
    body = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.int64)
    head = torch.tensor(header + [body.numel()], dtype=torch.int64)
    group.broadcast_(head.to(group.device))
    if body.numel():
        group.broadcast_(body.to(group.device))


def send_forward(group: TPGroup, fb: ForwardBatch) -> None:
    """Rank 0: send the forward of `fb` (CPU index tensors, the host table)."""
    b = fb.batch_size
    cols = int(fb.seq_lens.max()) if b else 0
    rows = fb.req_to_token[fb.req_pool_indices, :cols]
    mask = fb.custom_mask if fb.custom_mask is not None else torch.zeros(0, dtype=torch.bool)
    indptr = fb.mask_indptr if fb.mask_indptr is not None else torch.zeros(0, dtype=torch.int64)
    logits = fb.logits_indices
    header = [
        Op.FORWARD,
        _MODES.index(fb.mode),
        fb.input_ids.numel(),
        b,
        cols,
        mask.numel(),
        indptr.numel(),
        -1 if logits is None else logits.numel(),
        int(fb.argmax_only),
    ]
    payload = [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices, fb.seq_lens]
    payload += [fb.extend_prefix_lens, fb.extend_seq_lens, rows, mask, indptr]
    if logits is not None:
        payload.append(logits)
    _send(group, header, payload)


def send_copy_slots(group: TPGroup, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Rank 0: ask every rank to copy its KV rows of slots `src` into `dst` (int64 [n])."""
    _send(group, [Op.COPY_SLOTS, 0, src.numel()] + [0] * (_HEADER - 3), [src, dst])


def send_shutdown(group: TPGroup) -> None:
    """Rank 0: end the other ranks' step loops."""
    _send(group, [Op.SHUTDOWN] + [0] * (_HEADER - 1), [])


def receive(group: TPGroup, table: torch.Tensor) -> Step:
    """Ranks > 0: the next step from rank 0. A forward's table rows are written into
    `table` (this rank's int32 request-to-token table), which its batch then refers to."""
    head = group.broadcast_(torch.zeros(_HEADER + 1, dtype=torch.int64, device=group.device))
    op, mode, t, b, cols, n_mask, n_indptr, n_logits, argmax, total = head.cpu().tolist()
    body = torch.zeros(total, dtype=torch.int64, device=group.device)
    if total:
        body = group.broadcast_(body).cpu()
    if op == Op.SHUTDOWN:
        return Step(Op.SHUTDOWN)
    if op == Op.COPY_SLOTS:
        return Step(Op.COPY_SLOTS, src=body[:t], dst=body[t : 2 * t])
    sizes = [t, t, t, b, b, b, b, b * cols, n_mask, n_indptr, max(n_logits, 0)]
    ids, pos, loc, rows, seq, pre, ext, cells, mask, indptr, logits = body.split(sizes)
    if b and cols:
        table[rows, :cols] = cells.view(b, cols).to(table.dtype)
    fb = ForwardBatch(
        mode=_MODES[mode],
        input_ids=ids,
        positions=pos,
        out_cache_loc=loc,
        req_pool_indices=rows,
        seq_lens=seq,
        extend_prefix_lens=pre,
        extend_seq_lens=ext,
        req_to_token=table,
        custom_mask=mask.bool() if n_mask else None,
        mask_indptr=indptr if n_indptr else None,
        logits_indices=logits if n_logits >= 0 else None,
        argmax_only=bool(argmax),
    )
    return Step(Op.FORWARD, fb=fb)
