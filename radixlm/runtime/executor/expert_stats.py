"""Distinct experts per decode step of a mixture-of-experts model, by batch size: what
`radixlm plan moe` predicts (E (1 - (1 - k/E)^b) under uniform routing), as measured.

Each `SparseMoeBlock` counts the distinct experts of its every forward (`ExpertCounter`);
after a DECODE step the model runner hands the step to `ExpertStats.after_decode`, which
adds each MoE layer's latest count under the step's batch size. Steps inside a replayed
CUDA graph run no Python and are not counted (the counters then hold the last eager
step's values; `ModelRunner` records only eagerly run decode steps).
"""

from __future__ import annotations

from collections import defaultdict

from torch import nn

from radixlm.runtime.executor.layers.moe import SparseMoeBlock


class ExpertStats:
    """Per-batch-size totals over a model's MoE layers.

    Args:
        model: the loaded model; its `SparseMoeBlock`s are found once.
    """

    def __init__(self, model: nn.Module):
        self.blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
        #: batch size -> [decode steps, sum over steps and layers of distinct experts]
        self._by_batch: dict[int, list[int]] = defaultdict(lambda: [0, 0])

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def after_decode(self, batch_size: int) -> None:
        """Record the decode step just run over `batch_size` requests (one token each)."""
        entry = self._by_batch[batch_size]
        entry[0] += 1
        entry[1] += sum(b.counter.last for b in self.blocks)

    def report(self) -> dict | None:
        """None for a dense model; else the MoE shape and, per batch size seen (as a
        string key), decode steps and the mean distinct experts per layer per step."""
        if not self.blocks:
            return None
        opts = self.blocks[0].opts
        layers = len(self.blocks)
        return {
            "moe_layers": layers,
            "num_experts": opts.num_experts,
            "top_k": opts.top_k,
            "distinct_experts_per_decode_step": {
                str(b): {"steps": steps, "mean_per_layer": total / (steps * layers)}
                for b, (steps, total) in sorted(self._by_batch.items())
            },
        }
