"""Random paged-attention cases: a KV pool with scattered pages, a request-to-token table,
and the ForwardBatch of one extend, decode or tree-verify step over it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.kernels.forward_batch import tree_mask_indptr
from radixlm.runtime.executor.memory import KVPool
from tests.tiny_models import save_random_model


@dataclass
class Case:
    pool: KVPool
    fb: ForwardBatch
    q: torch.Tensor  # [T, H, D]
    k: torch.Tensor  # [T, Hkv, D] new tokens' K/V
    v: torch.Tensor
    scaling: float

    def clone_pool(self) -> KVPool:
        """A copy of the pool, so two backends start from identical buffers."""
        pool = KVPool.__new__(KVPool)
        pool.__dict__.update(self.pool.__dict__)
        pool.k_buffer = [b.clone() for b in self.pool.k_buffer]
        pool.v_buffer = [b.clone() for b in self.pool.v_buffer]
        return pool


def random_tree_mask(prefix: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """bool [n, prefix + n]: every draft sees the prefix, its ancestors and itself; draft j's
    parent is a random earlier draft (or the prefix for j = 0 and by chance)."""
    mask = torch.zeros(n, prefix + n, dtype=torch.bool)
    mask[:, :prefix] = True
    for j in range(n):
        mask[j, prefix + j] = True
        parent = int(torch.randint(-1, j, (1,), generator=gen)) if j else -1
        if parent >= 0:
            mask[j, prefix : prefix + n] |= mask[parent, prefix : prefix + n]
    return mask


def make_case(
    mode: ForwardMode,
    prefix_lens: list[int],
    extend_lens: list[int],
    *,
    page_size: int = 1,
    group: int = 1,
    kv_heads: int = 2,
    head_dim: int = 16,
    num_layers: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> Case:
    """A step over len(prefix_lens) requests whose pages are scattered through the pool.

    Unused slots hold NaN, so a kernel that reads outside a request's keys fails loudly;
    the padding page is zero as in `KVPool`.
    """
    gen = torch.Generator().manual_seed(seed)
    bsz = len(prefix_lens)
    seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
    pages_per_req = [-(-s // page_size) for s in seq_lens]
    num_pages = sum(pages_per_req) + 3
    num_slots = (num_pages + 1) * page_size
    pool = KVPool(num_slots, num_layers, kv_heads, head_dim, dtype, "cpu", page_size)
    page_ids = (torch.randperm(num_pages, generator=gen) + 1).tolist()
    context = max(seq_lens) + 5
    rows = torch.randperm(bsz + 3, generator=gen)[:bsz]
    table = torch.zeros(bsz + 3, context, dtype=torch.int32)
    locs = []
    for i, (p, s) in enumerate(zip(prefix_lens, seq_lens)):
        pages = torch.tensor([page_ids.pop() for _ in range(pages_per_req[i])])
        pos = torch.arange(s)
        slots = pages[pos // page_size] * page_size + pos % page_size
        table[rows[i], :s] = slots.to(torch.int32)
        locs.append(slots[p:])
    for layer in range(num_layers):
        for buf in (pool.k_buffer[layer], pool.v_buffer[layer]):
            buf.fill_(float("nan"))
            buf[:page_size] = 0
            used = table[rows].flatten().to(torch.int64)
            buf[used] = torch.randn(used.numel(), kv_heads, head_dim, generator=gen).to(dtype)
            buf[:page_size] = 0
    tokens = sum(extend_lens)
    heads = kv_heads * group
    q = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
    pre = torch.tensor(prefix_lens)
    ext = torch.tensor(extend_lens)
    custom_mask = mask_indptr = None
    if mode is ForwardMode.TARGET_VERIFY:
        custom_mask = torch.cat(
            [random_tree_mask(p, n, gen).flatten() for p, n in zip(prefix_lens, extend_lens)]
        )
        mask_indptr = tree_mask_indptr(ext, pre + ext)
    fb = ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(tokens, dtype=torch.int64),
        positions=torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, extend_lens)]),
        out_cache_loc=torch.cat(locs),
        req_pool_indices=rows.to(torch.int64),
        seq_lens=pre + ext,
        extend_prefix_lens=pre,
        extend_seq_lens=ext,
        req_to_token=table,
        custom_mask=custom_mask,
        mask_indptr=mask_indptr,
    )
    case = Case(pool, fb, q, k, v, head_dim**-0.5)
    if device != "cpu":
        case.pool.k_buffer = [b.to(device) for b in pool.k_buffer]
        case.pool.v_buffer = [b.to(device) for b in pool.v_buffer]
        case.fb = fb.to(device)
        case.q, case.k, case.v = q.to(device), k.to(device), v.to(device)
    return case


def dense_reference(case: Case) -> torch.Tensor:
    """Attention of every new token written out densely from the table and the mask
    (after storing the new K/V): the reference for torch_native itself. fp64 [T, H, Dv]."""
    fb, pool = case.fb, case.pool
    k_buf, v_buf = pool.k_buffer[0].clone(), pool.v_buffer[0].clone()
    loc = fb.out_cache_loc
    k_buf[loc], v_buf[loc] = case.k.to(k_buf.dtype), case.v.to(v_buf.dtype)
    heads, kv_heads = case.q.shape[1], k_buf.shape[1]
    out = torch.empty(*case.q.shape[:2], v_buf.shape[-1], dtype=torch.float64)
    start = 0
    offsets = fb.mask_indptr.tolist() if fb.mask_indptr is not None else None
    for i in range(fb.batch_size):
        p, n = int(fb.extend_prefix_lens[i]), int(fb.extend_seq_lens[i])
        s = p + n
        slots = fb.req_to_token[fb.req_pool_indices[i], :s].to(torch.int64)
        keys = k_buf[slots].double().repeat_interleave(heads // kv_heads, 1)  # [s, H, D]
        vals = v_buf[slots].double().repeat_interleave(heads // kv_heads, 1)
        if offsets is not None:
            mask = fb.custom_mask[offsets[i] : offsets[i + 1]].view(n, s)
        else:
            mask = torch.arange(s)[None, :] <= (p + torch.arange(n))[:, None]
        qi = case.q[start : start + n].double()
        scores = torch.einsum("nhd,shd->hns", qi, keys) * case.scaling
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out[start : start + n] = torch.einsum("hns,shd->nhd", scores.softmax(-1), vals)
        start += n
    return out


def save_tiny_llama(path: Path, hf_dir: Path, head_dim: int) -> Path:
    """A 2-layer random-initialised Llama (6 query / 2 KV heads of `head_dim`, tied head)
    saved with the bundled model's tokenizer as a Hugging Face directory at `path`."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=6 * head_dim,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    save_random_model(config, path, hf_dir)
    return path
