"""Tensor-parallel layers (Megatron-style, Shoeybi et al. 2019): one rank's shard of a
dense decoder.

* q/k/v and gate/up are column-parallel: each rank computes its own heads / MLP columns,
  with no communication.
* o and down are row-parallel: each rank multiplies its slice of the input features and
  one all-reduce sums the partial products (the bias is added once, after it).
* The embedding is vocabulary-parallel: each rank holds ceil(V / N) rows, looks up the ids
  in its range (zeros elsewhere), and an all-reduce sums the parts. The head holds the same
  rows; its logits parts are gathered on rank 0 (the sampler's rank) and joined.
* KV heads split like the query heads; with fewer KV heads than ranks each rank keeps the
  one KV head its query heads read (replicated N / num_kv_heads times, as
  `radixlm.plan.kv` assumes), so the ranks' KV pools hold only their own heads.
* Latent attention (MLA) keeps the latent whole on every rank (its down-projections
  `q_a_proj`, `kv_a_proj_with_mqa` replicated, so each rank caches the full latent) and
  splits what depends on the head: q_proj / q_b_proj and kv_b_proj by heads, o_proj by
  input rows with its all-reduce.
* Mixture-of-experts blocks split every expert (and the shared one) inside itself, with
  the router replicated and one all-reduce after the block (`layers/tp_moe.py`).

Each module declares the checkpoint slice it holds (`tp_shards`, `parallel/shards.py`);
the loader slices by it. The layers are plain torch (`TorchLayers`): under tensor
parallelism the CPU also runs torch's GEMM, not the packed C-kernel layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.executor.layers.base import TorchLayers
from radixlm.runtime.executor.layers.blocks import AttentionOptions
from radixlm.runtime.executor.layers.moe import MoEOptions
from radixlm.runtime.executor.layers.tp_moe import TensorParallelMoeBlock
from radixlm.runtime.executor.parallel.group import TPGroup
from radixlm.runtime.executor.parallel.shards import Shard

_COLUMN = ("q_proj", "q_b_proj", "gate_proj", "up_proj")
#: Latent attention's down-projections: every rank computes the whole latent.
_REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa")
_KV = ("k_proj", "v_proj")
_ROW = ("o_proj", "down_proj")


def check_tensor_parallel(config, size: int) -> None:
    """Raise ValueError unless a `size`-way split of `config` is possible: the attention
    heads and the MLP width divide by `size`, and the KV heads divide by it or it by them
    (each rank's query heads then read one whole KV head; not asked of latent attention,
    whose latent is not split), as do the MLP and experts' widths."""
    if size == 1:
        return
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % size:
        raise ValueError(
            f"--tp-size {size} does not divide the model's {heads} attention heads; "
            f"use a divisor of {heads}"
        )
    # Latent attention caches one latent every rank holds whole: no KV heads to split.
    if not getattr(config, "kv_lora_rank", None) and kv % size and size % kv:
        raise ValueError(
            f"--tp-size {size} and the model's {kv} KV heads: one must divide the other"
        )
    for field in _WIDTHS:
        width = getattr(config, field, None)
        if width and width % size:
            raise ValueError(f"--tp-size {size} does not divide {field} {width}")


#: MLP widths a split divides: the dense MLP's, each routed expert's, the shared expert's.
_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


def vocab_part(vocab: int, size: int) -> int:
    """Rows of the vocabulary each rank holds: ceil(vocab / size) (the last part padded)."""
    return -(-vocab // size)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r @ W_r^T) + b: `weight` [out, in / N] (this rank's input
    features), `bias` [out] whole, added after the sum."""

    def __init__(self, group: TPGroup, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.group = group
        local = in_features // group.size
        self.weight = nn.Parameter(torch.empty(out_features, local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        start = group.rank * local
        self.tp_shards = {"weight": Shard(1, start, start + local)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce_(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token embedding over this rank's vocabulary rows [start, start + part): ids
    elsewhere look up zeros, and an all-reduce sums the ranks' parts. `weight` [part,
    hidden]."""

    def __init__(self, group: TPGroup, vocab: int, hidden: int):
        super().__init__()
        self.group = group
        part = vocab_part(vocab, group.size)
        self.start = group.rank * part
        self.weight = nn.Parameter(torch.empty(part, hidden))
        stop = min(vocab, self.start + part)
        self.tp_shards = {"weight": Shard(0, self.start, stop, part)}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        x = x.masked_fill(outside[:, None], 0.0)
        return self.group.all_reduce_(x)


class VocabParallelHead(nn.Module):
    """The output head over this rank's vocabulary rows: logits parts [R, part] gathered on
    rank 0 and joined into [R, vocab]; the other ranks return their own part (unused).
    `weight` [part, hidden], the embedding's rows when tied."""

    def __init__(self, group: TPGroup, vocab: int, hidden: int):
        super().__init__()
        self.group = group
        self.vocab = vocab
        part = vocab_part(vocab, group.size)
        start = group.rank * part
        self.weight = nn.Parameter(torch.empty(part, hidden))
        self.tp_shards = {"weight": Shard(0, start, min(vocab, start + part), part)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        parts = self.group.gather_to_first(logits)
        return logits if parts is None else torch.cat(parts, dim=-1)[:, : self.vocab]


class TensorParallelLayers(TorchLayers):
    """One rank's shard of a dense decoder (see the module docstring); raises as
    `check_tensor_parallel` for a config it cannot split, ValueError for a projection it
    does not know how to split."""

    def __init__(self, group: TPGroup, config, expert_parallel: bool = False):
        check_tensor_parallel(config, group.size)
        self.group = group
        #: Place whole routed experts on the ranks instead of splitting each (`--ep-size`).
        self.expert_parallel = expert_parallel
        n, r = group.size, group.rank
        kv = self.kv_total = config.num_key_value_heads
        #: This rank's KV heads: [kv_start, kv_start + kv_heads) of the model's.
        self.kv_heads = max(kv // n, 1)
        self.kv_start = r * kv // n
        self.heads = config.num_attention_heads // n

    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
        kind = name.rsplit(".", 1)[-1]
        n, r = self.group.size, self.group.rank
        if kind in _ROW:
            return RowParallelLinear(self.group, in_features, out_features, bias)
        if kind in _REPLICATED:
            return nn.Linear(in_features, out_features, bias=bias)
        if kind in _COLUMN:
            local = out_features // n
            start = r * local
        elif kind in _KV:
            per_head = out_features // self.kv_total
            local, start = self.kv_heads * per_head, self.kv_start * per_head
        else:
            raise ValueError(f"tensor parallelism does not know how to split {name}")
        module = nn.Linear(in_features, local, bias=bias)
        module.tp_shards = {"weight": Shard(0, start, start + local)}
        if bias:
            module.tp_shards["bias"] = Shard(0, start, start + local)
        return module

    def embedding(self, vocab: int, hidden: int) -> nn.Module:
        return VocabParallelEmbedding(self.group, vocab, hidden)

    def lm_head(self, hidden: int, vocab: int, bias: bool = False) -> nn.Module:
        if bias:
            raise ValueError("tensor parallelism does not split a biased output head")
        return VocabParallelHead(self.group, vocab, hidden)

    def head_range(self, num_heads: int) -> tuple[int, int]:
        count = num_heads // self.group.size
        return self.group.rank * count, count

    def moe(self, opts: MoEOptions, prefix: str) -> nn.Module:
        return TensorParallelMoeBlock(self.group, opts, prefix, self.expert_parallel)

    def attention(self, config, layer_id: int, opts: AttentionOptions, prefix: str) -> nn.Module:
        attn = super().attention(config, layer_id, opts, prefix)
        attn.num_heads, attn.num_kv_heads = self.heads, self.kv_heads
        return attn
