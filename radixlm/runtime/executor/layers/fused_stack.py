"""The fused layer runner of the packed CPU layout: every decoder layer of a step in one C
call (`CpuKernels.decode_layers`) wherever the attention backend can hand the step's
attention to it (`AttentionBackend.fused_decode_tables`).
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.kernels.cpu import CpuKernels, LayerSpec
from radixlm.runtime.executor.layers.blocks import run_in_order


class FusedDecodeStack:
    """`DecoderModel.run_layers` for the packed layout. When the backend answers
    `fused_decode_tables(fb)` (the `cpu` backend: decode steps, and causal extend or
    chain-draft verify steps where it runs the C extend kernel), every decoder layer runs
    in one C call, updating x float32 [T, hidden] in place; otherwise the layers run in
    order (`run_in_order`). One call runs the same kernels the layer modules would, without
    a dozen Python calls per layer. Its scratch holds T * (2 hidden + qkv + H D + 3 inter)
    floats (see docs/perf-notes.md for what it saves).

    It holds each layer's weight tensors (`CpuDecoderLayer.weights()`) from construction
    and re-reads their addresses every step: a `.data` move is followed, a parameter
    object replaced afterwards is not (build a new stack then).

    Raises ValueError when the layers are not all fused-capable loaded `CpuDecoderLayer`s
    of one size (`fusable`; use `run_in_order` for those).
    """

    def __init__(self, layers: nn.ModuleList, kernels: CpuKernels):
        if not fusable(layers):
            raise ValueError("FusedDecodeStack needs fused-capable CpuDecoderLayers of one size")
        self._kernels = kernels
        self._specs = (LayerSpec * len(layers))(*(layer.spec for layer in layers))
        #: Each layer's weight tensors, held here: looking them up through the modules
        #: every step is a measurable share of a small step.
        self._weights = [layer.weights() for layer in layers]

    def __call__(self, layers, x, rope, backend, fb) -> torch.Tensor:
        tables = backend.fused_decode_tables(fb)
        if tables is None:
            return run_in_order(layers, x, rope, backend, fb)
        # Addresses are re-read every step, so a parameter whose `.data` moved can never
        # leave C a stale pointer.
        for spec, w in zip(self._specs, self._weights):  # spec: a view into the array
            spec.ln1, spec.ln2, spec.qkv = w[0].data_ptr(), w[1].data_ptr(), w[2].data_ptr()
            spec.qkv_bias = None if w[3] is None else w[3].data_ptr()
            spec.o, spec.gate_up, spec.down = w[4].data_ptr(), w[5].data_ptr(), w[6].data_ptr()
            spec.scale = tables.scaling
        x = x.contiguous()
        self._kernels.decode_layers(
            self._specs, x, rope[0], rope[1], tables.k_buffers, tables.v_buffers,
            fb.out_cache_loc, tables.slots, tables.seq_lens, tables.ext_lens,
        )  # fmt: skip
        return x


def fusable(layers) -> bool:
    """Whether `FusedDecodeStack` takes these layers: one or more loaded layers that are
    fused-capable (`fused_decode`, set by `CpuDecoderLayer` after loading), all of one size
    (hidden, inter, heads, kv_heads, head_dim, eps)."""
    if not layers or not all(getattr(la, "fused_decode", False) for la in layers):
        return False
    fields = ("hidden", "inter", "heads", "kv_heads", "head_dim", "eps")
    return len({tuple(getattr(la.spec, f) for f in fields) for la in layers}) == 1
