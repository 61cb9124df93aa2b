"""Sliding-window attention (Mistral; Gemma 2/3's local layers): the per-layer windows and
the masks the reference backends build from them.

With window W the query at absolute position i sees the key at absolute position j iff
j <= i and i - j < W: the W most recent positions, itself included (transformers'
`masking_utils.sliding_window_overlay`). A layer whose window is None attends causally
over the whole sequence. Under a tree mask (TARGET_VERIFY) the window applies on top of
the tree: key index k (the key's place in the request's [prefix, drafts] layout, taken
as its position) is kept iff positions[token] - k < W.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixlm.kernels.forward_batch import ForwardBatch


def layer_windows(sliding_windows: Sequence[int | None] | None, num_layers: int) -> tuple:
    """One window per layer: `sliding_windows` checked and made a tuple of `num_layers`
    entries, each a positive int or None (all None when `sliding_windows` is None).

    Raises ValueError when the length differs from num_layers or a window is below 1.
    """
    if sliding_windows is None:
        return (None,) * num_layers
    windows = tuple(None if w is None else int(w) for w in sliding_windows)
    if len(windows) != num_layers:
        raise ValueError(f"{len(windows)} sliding windows given for {num_layers} layers")
    if any(w is not None and w < 1 for w in windows):
        raise ValueError(f"sliding windows must be >= 1 or None, got {list(windows)}")
    return windows


def window_keep(query_pos: torch.Tensor, num_keys: int, window: int) -> torch.Tensor:
    """bool [n, num_keys]: key k is inside the window of the query at position
    query_pos[j] (int64 [n]), i.e. query_pos[j] - k < window. Causality is not applied."""
    keys = torch.arange(num_keys, device=query_pos.device)
    return keys[None, :] > query_pos[:, None] - window


def causal_window_mask(n: int, s: int, p: int, window: int, device) -> torch.Tensor:
    """bool [n, s] for an extend of n new tokens after a prefix of p (s = p + n keys): new
    token j (position p + j) sees keys max(0, p + j - window + 1) .. p + j."""
    pos = p + torch.arange(n, device=device)
    keys = torch.arange(s, device=device)
    return (keys[None, :] <= pos[:, None]) & window_keep(pos, s, window)


def verify_window_mask(fb: ForwardBatch, window: int) -> torch.Tensor:
    """`fb.custom_mask` (bool [sum_b n_b * s_b], TARGET_VERIFY) with the window applied:
    entry (b, j, k) also needs positions[token j of b] - k < window. Same layout and device;
    reads the lengths on the host."""
    n_lens, s_lens = fb.extend_seq_lens.tolist(), fb.seq_lens.tolist()
    pos = fb.positions.to(torch.int64)
    parts, start = [], 0
    for n, s in zip(n_lens, s_lens):
        parts.append(window_keep(pos[start : start + n], s, window).flatten())
        start += n
    return fb.custom_mask.to(torch.bool) & torch.cat(parts)
