"""Memory pools: the request-to-token table, the paged KV pool and its slot allocator.

Layout (DESIGN.md section 3):
  * `ReqToTokenPool.req_to_token`: int32 [max_running_requests, context_len]; row r, column p
    holds the KV slot of position p of the request in row r.
  * `KVPool`: per layer K and V buffers [num_slots, num_kv_heads, head_dim].
  * `LatentKVPool` (multi-head latent attention): per layer one buffer [num_slots, 1,
    kv_lora_rank + rope_dim] holding the latent and the RoPE key; V is its latent part.
  * `PagedAllocator`: hands out whole pages of `page_size` slots; page 0 (slots
    0..page_size-1) is reserved as padding and never allocated, so slot 0 is always valid
    to read and never holds live data.
"""

from __future__ import annotations

import logging
import os

import torch

from radixlm.errors import RequestTooLargeError
from radixlm.kernels.cpu.weights import empty_in_huge_pages
from radixlm.kernels.fp8 import KVScales, is_fp8, quantize

logger = logging.getLogger(__name__)


class OutOfSlotsError(RuntimeError):
    """The allocator has fewer free slots than requested (the scheduler evicts first)."""


class ReqToTokenPool:
    """Rows of the request-to-token table, one per running request.

    Args:
        size: number of rows (max concurrently running requests).
        context_len: columns (max tokens per request).
    """

    def __init__(self, size: int, context_len: int, device: str | torch.device = "cpu"):
        self.size = size
        self.context_len = context_len
        self.req_to_token = torch.zeros(size, context_len, dtype=torch.int32, device=device)
        self._free_rows = list(range(size - 1, -1, -1))

    def available(self) -> int:
        """Free rows."""
        return len(self._free_rows)

    def alloc(self) -> int:
        """Take a free row. Raises OutOfSlotsError when none is free."""
        if not self._free_rows:
            raise OutOfSlotsError("no free request rows")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        """Give a row back."""
        self._free_rows.append(row)


class KVPool:
    """K and V buffers for every layer, indexed by KV slot.

    Args:
        num_slots: slots per buffer including the reserved padding page.
        num_layers, num_kv_heads, head_dim: model attention layout.
        dtype: storage dtype of K and V (float32, bfloat16, float16, or an fp8 dtype).
        padding_slots: leading slots zeroed for padding reads (the reserved page).

    An fp8 pool's per-layer scales (`kv_scales`) are 1.0 until `use_scales` sets them
    (the checkpoint's, before the first write); other pools have none.

    Bytes per token = num_layers * num_kv_heads * head_dim * 2 (K and V) * dtype size.
    On the CPU every buffer lies in one mapping advised for transparent huge pages
    (`empty_in_huge_pages`): attention reads rows through slot lists, and with 4 KiB pages
    nearly every row costs a TLB miss.

    On the CPU the whole pool is zeroed here, so its memory is taken (and its pages
    mapped) at start, as a GPU pool's is, not by the decode step that first writes each
    page. The buffers advance together, so a step whose slots cross into new pages maps
    one 2 MiB page per buffer (60 for SmolLM2-135M), which stalls that step where the host
    backs guest memory on first touch. Elsewhere only the padding slots are zeroed
    (attention reads them for masked positions). Measurements: docs/perf-notes.md,
    "Weights and KV in huge pages".
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        padding_slots: int = 1,
    ):
        shape = (num_slots, num_kv_heads, head_dim)
        # The padding page must hold finite values: attention reads it for masked
        # positions. On the CPU the buffers share one mapping in transparent huge pages
        # (None where the kernel refuses): attention reads each request's rows through
        # its slot list, and with 4 KiB pages nearly every row it reads costs a TLB miss.
        cpu = torch.device(device).type == "cpu"
        self._arena, bufs = None, []
        if cpu:
            self._arena, bufs = empty_in_huge_pages([(shape, dtype)] * (2 * num_layers))
        if self._arena is None:
            bufs = [torch.empty(shape, dtype=dtype, device=device) for _ in range(2 * num_layers)]
        self.k_buffer, self.v_buffer = bufs[:num_layers], bufs[num_layers:]
        for buf in self.k_buffer + self.v_buffer:
            (buf if cpu else buf[:padding_slots]).zero_()
        self.dtype = dtype
        #: Per-layer dequantization scales of an fp8 pool; None for other dtypes.
        self.kv_scales = KVScales.ones(num_layers) if is_fp8(dtype) else None
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)

    def use_scales(self, scales: KVScales) -> None:
        """Quantize with `scales` from now on (`_checked_scales`)."""
        self.kv_scales = _checked_scales(self, scales)

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K, V [T, num_kv_heads, head_dim] of T new tokens into slots `loc` (int64
        [T]); an fp8 pool quantizes them with the layer's scales (`kernels.fp8.quantize`)."""
        if self.kv_scales is None:
            self.k_buffer[layer_id].index_copy_(0, loc, k.to(self.dtype))
            self.v_buffer[layer_id].index_copy_(0, loc, v.to(self.dtype))
            return
        ks, vs = self.kv_scales.k[layer_id], self.kv_scales.v[layer_id]
        copy_rows(self.k_buffer[layer_id], loc, quantize(k, ks, self.dtype))
        copy_rows(self.v_buffer[layer_id], loc, quantize(v, vs, self.dtype))

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's K and V rows of slots `src` into slots `dst` (int64 [n], on
        the pool's device; the two may overlap: each buffer's rows are read before written)."""
        for buf in self.k_buffer + self.v_buffer:
            copy_rows(buf, dst, buf.index_select(0, src))


class LatentKVPool:
    """The KV cache of multi-head latent attention (DeepSeek-V2, Liu et al. 2024, section
    2.1): per layer and token one row [kv_lora_rank latent ; rope_dim RoPE key], shared by
    every head, instead of per-head K and V.

    Attention in the absorbed form reads it as multi-query attention with one KV head:
    `k_buffer[l]` [num_slots, 1, kv_lora_rank + rope_dim] is the key, and `v_buffer[l]` is
    the view `k_buffer[l][:, :, :kv_lora_rank]` (the latent; no storage of its own).
    `set_kv` writes the key row only, since the value is part of it. Same attributes as
    `KVPool` (k_buffer, v_buffer, dtype, bytes_per_token), so the allocator, the radix
    cache and the backends index it the same way.

    Args:
        num_slots: slots per buffer including the reserved padding page.
        num_layers: decoder layers. kv_lora_rank, rope_dim: the latent and RoPE key widths.
        dtype: storage dtype. padding_slots: leading slots zeroed (the reserved page).

    An fp8 pool's scales are `KVPool`'s (`use_scales`); the value is part of the key
    row, so each layer's K and V scales must be equal.

    Bytes per token = num_layers * (kv_lora_rank + rope_dim) * dtype size
    (`latent_kv_bytes_per_token`). On the CPU the buffers lie in one huge-page mapping and
    are zeroed at start, as `KVPool`'s are (see there).
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        kv_lora_rank: int,
        rope_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        padding_slots: int = 1,
    ):
        shape = (num_slots, 1, kv_lora_rank + rope_dim)
        cpu = torch.device(device).type == "cpu"
        self._arena, bufs = None, []
        if cpu:
            self._arena, bufs = empty_in_huge_pages([(shape, dtype)] * num_layers)
        if self._arena is None:
            bufs = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        for buf in bufs:
            (buf if cpu else buf[:padding_slots]).zero_()
        self.k_buffer = bufs
        self.v_buffer = [buf[:, :, :kv_lora_rank] for buf in bufs]
        self.kv_lora_rank = kv_lora_rank
        self.dtype = dtype
        self.kv_scales = KVScales.ones(num_layers) if is_fp8(dtype) else None
        self.bytes_per_token = latent_kv_bytes_per_token(num_layers, kv_lora_rank, rope_dim, dtype)

    def use_scales(self, scales: KVScales) -> None:
        """Quantize with `scales` from now on (`_checked_scales`; ValueError also when a
        layer's K and V scales differ)."""
        if scales.k != scales.v:
            raise ValueError("a latent KV pool's value is part of its key: K and V scales differ")
        self.kv_scales = _checked_scales(self, scales)

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the rows k [T, 1, kv_lora_rank + rope_dim] of T new tokens into slots `loc`
        (int64 [T]); v (their latents, k's leading part) is not written twice. An fp8 pool
        quantizes them with the layer's scale."""
        if self.kv_scales is None:
            self.k_buffer[layer_id].index_copy_(0, loc, k.to(self.dtype))
            return
        scale = self.kv_scales.k[layer_id]
        copy_rows(self.k_buffer[layer_id], loc, quantize(k, scale, self.dtype))

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's rows of slots `src` into slots `dst` (int64 [n], on the pool's
        device; they may overlap). Only `k_buffer`: copying the aliasing `v_buffer` again
        would read rows the first copy already overwrote."""
        for buf in self.k_buffer:
            copy_rows(buf, dst, buf.index_select(0, src))


def _checked_scales(pool, scales: KVScales) -> KVScales:
    """`scales` for `pool`. Raises ValueError unless the pool is fp8 and `scales` has one
    entry per layer."""
    if not is_fp8(pool.dtype):
        raise ValueError(f"KV scales apply to fp8 pools, not {pool.dtype}")
    if len(scales.k) != len(pool.k_buffer):
        raise ValueError(f"{len(scales.k)} KV scales for {len(pool.k_buffer)} layers")
    return scales


def copy_rows(buf: torch.Tensor, loc: torch.Tensor, rows: torch.Tensor) -> None:
    """buf[loc] = rows (index_copy_); fp8 buffers through their bytes, which torch's CPU
    index_copy_ does not take as fp8."""
    if is_fp8(buf.dtype):
        buf, rows = buf.view(torch.uint8), rows.view(torch.uint8)
    buf.index_copy_(0, loc, rows)


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """KV bytes per cached token: layers * kv_heads * head_dim * 2 (K and V) * element size."""
    return num_layers * num_kv_heads * head_dim * 2 * torch.empty((), dtype=dtype).element_size()


def latent_kv_bytes_per_token(
    num_layers: int, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype
) -> int:
    """Latent KV bytes per cached token: layers * (kv_lora_rank + rope_dim) * element size
    (DeepSeek-V3 in bf16: 61 * 576 * 2 = 70,272)."""
    return num_layers * (kv_lora_rank + rope_dim) * torch.empty((), dtype=dtype).element_size()


class PagedAllocator:
    """Free list of KV pages; sizes are reported in tokens (slots).

    The list is a stack whose top is the lowest page of the last pages freed (at start,
    page 1), and `alloc_pages` returns pages in ascending order: a request's slots then
    run forward through the KV pool where they can, so attention reads its rows as
    ascending streams, which the hardware prefetcher follows (`benchmarks/kv_layout.py`;
    docs/perf-notes.md, "Weights and KV in huge pages").

    Args:
        num_tokens: usable slots (a multiple of page_size); the buffers hold
            num_tokens + page_size slots because page 0 is reserved.
        page_size: slots per page (a power of two).
    """

    def __init__(self, num_tokens: int, page_size: int):
        assert num_tokens % page_size == 0
        self.page_size = page_size
        self.num_pages = num_tokens // page_size
        self.total = num_tokens
        self._free_pages: list[int] = list(range(self.num_pages, 0, -1))

    def available(self) -> int:
        """Free slots (tokens)."""
        return len(self._free_pages) * self.page_size

    def alloc_pages(self, n: int) -> torch.Tensor:
        """Take `n` pages; returns their page ids (int64 [n]). Raises OutOfSlotsError."""
        if n > len(self._free_pages):
            raise OutOfSlotsError(f"need {n} pages, {len(self._free_pages)} free")
        pages = self._free_pages[len(self._free_pages) - n :]
        del self._free_pages[len(self._free_pages) - n :]
        return torch.tensor(pages[::-1], dtype=torch.int64)

    def free(self, slots: torch.Tensor) -> None:
        """Return the pages covering `slots` (int64 [n]); each page must be wholly owned."""
        if slots.numel() == 0:
            return
        pages = torch.unique(slots.to(torch.int64) // self.page_size).tolist()
        self._free_pages.extend(reversed(pages))

    def alloc_positions(self, last_slot: int, start: int, n: int) -> torch.Tensor:
        """Slots for positions start..start+n-1 of one request (int64 [n]).

        Positions sharing a page with position start-1 (whose slot is `last_slot`) reuse that
        page; the rest get fresh pages. Position p sits at offset p % page_size of its page.
        """
        ps = self.page_size
        if ps == 1:
            return self.alloc_pages(n)
        in_last = min((-start) % ps, n) if start % ps else 0
        head = torch.arange(last_slot + 1, last_slot + 1 + in_last, dtype=torch.int64)
        new_pages = -(-(n - in_last) // ps)
        pages = self.alloc_pages(new_pages)
        body = (pages[:, None] * ps + torch.arange(ps)[None, :]).flatten()[: n - in_last]
        return torch.cat([head, body])

    @staticmethod
    def pages_needed(page_size: int, start: int, n: int) -> int:
        """New pages to extend a request from `start` to `start + n` tokens."""
        return -(-(start + n) // page_size) - (-(-start // page_size))


def check_fits(
    prompt_len: int,
    max_new_tokens: int,
    *,
    context_len: int,
    total_tokens: int,
    page_size: int,
    cap_to_context: bool = True,
) -> None:
    """Raise RequestTooLargeError (code "context_length_exceeded") unless the request can
    run: the prompt is shorter than the context (else param "prompt"); without
    `cap_to_context`, prompt + max_new_tokens is at most the context (else param
    "max_new_tokens": the HTTP server's rule, docs/serving.md "Limits"); and prompt +
    max_new_tokens, capped by the context (where generation stops anyway) and rounded up
    to pages, fits the whole KV pool (else param "max_new_tokens"). Lengths in tokens."""
    if prompt_len >= context_len:
        raise RequestTooLargeError(
            f"prompt has {prompt_len} tokens; the context length is {context_len}",
            param="prompt",
        )
    if not cap_to_context and prompt_len + max_new_tokens > context_len:
        raise RequestTooLargeError(
            f"This model's maximum context length is {context_len} tokens. However, you "
            f"requested {prompt_len + max_new_tokens} tokens ({prompt_len} in the prompt, "
            f"{max_new_tokens} to generate). Please reduce the prompt or the tokens to "
            "generate.",
            param="max_new_tokens",
        )
    need = PagedAllocator.pages_needed(page_size, 0, min(prompt_len + max_new_tokens, context_len))
    if need * page_size > total_tokens:
        raise RequestTooLargeError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) "
            f"cannot fit the KV cache of {total_tokens} tokens",
            param="max_new_tokens",
        )


def available_memory_bytes() -> int:
    """Available host memory (MemAvailable from /proc/meminfo, else total physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_capacity_tokens(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """Tokens that fit in `budget_bytes`, rounded down to a whole page."""
    return (budget_bytes // bytes_per_token) // page_size * page_size
