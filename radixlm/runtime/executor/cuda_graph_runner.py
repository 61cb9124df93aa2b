"""CUDA graphs for decode steps: capture the model once per padded batch size, replay after
copying the step's inputs into the graph's static buffers.

A decode step launches a few hundred small kernels; replaying a captured graph removes the
per-launch CPU cost, which dominates small-batch decode on a fast GPU. Batches are padded
up to the next captured size; a padding row decodes token 0 at position 0 of request row 0
with seq_len 1 and writes its K/V to the reserved padding slot 0, so it never touches a live
slot, and its logits are dropped (rows of a decode step do not interact).
"""

from __future__ import annotations

import bisect
import logging

import torch

from radixlm.kernels import AttentionBackend, ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_bs (and max_bs itself)."""
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= max_bs]
    sizes += list(range(16, max_bs + 1, 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class CudaGraphRunner:
    """Captured decode graphs for batch sizes up to `max_bs`.

    Args:
        model: callable `model(fb, backend) -> logits [B, vocab]`.
        backend: an AttentionBackend with `supports_cuda_graph`.
        req_to_token: the (device) request-to-token table every step reads.
        max_bs: largest captured batch (`--cuda-graph-max-bs`).
    """

    def __init__(self, model, backend: AttentionBackend, req_to_token: torch.Tensor, max_bs: int):
        self.model = model
        self.backend = backend
        self.req_to_token = req_to_token
        self.batch_sizes = capture_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        device = req_to_token.device
        n = self.max_bs

        def zeros():
            return torch.zeros(n, dtype=torch.int64, device=device)

        self.input_ids, self.positions, self.out_cache_loc = zeros(), zeros(), zeros()
        self.req_pool_indices, self.prefix_lens = zeros(), zeros()
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=device)
        self.extend_lens = torch.ones(n, dtype=torch.int64, device=device)
        self._pool = None  # the graphs' shared memory pool
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        backend.init_cuda_graph_state(self.max_bs, req_to_token.shape[1])
        self._capture()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            extend_prefix_lens=self.prefix_lens[:bs],
            extend_seq_lens=self.extend_lens[:bs],
            req_to_token=self.req_to_token,
        )

    def _capture(self) -> None:
        # Largest first, so smaller graphs reuse the memory pool the largest one reserved.
        for bs in reversed(self.batch_sizes):
            fb = self._static_batch(bs)
            self.backend.init_forward_metadata_cuda_graph(fb)
            self.graphs[bs], self.outputs[bs] = self._record(
                lambda f=fb: self.model(f, self.backend)
            )
        logger.info("captured decode CUDA graphs for batch sizes %s", self.batch_sizes)

    def _record(self, step):
        """Warm `step` up twice on a side stream (compiles kernels, creates library handles),
        then capture it; returns (graph, its static output)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            out = step()
        self._pool = graph.pool()
        torch.cuda.synchronize()
        return graph, out

    def can_run(self, fb: ForwardBatch) -> bool:
        """Whether `fb` is a decode step small enough for a captured graph."""
        return fb.mode is ForwardMode.DECODE and fb.batch_size <= self.max_bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Run decode step `fb` (tensors on the graph's device); returns logits [B, vocab].

        The returned tensor is the graph's static output: read it before the next replay.
        """
        bs = fb.batch_size
        padded = self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        self.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.prefix_lens[:bs].copy_(fb.extend_prefix_lens)
        if padded > bs:
            for buf in (self.input_ids, self.positions, self.out_cache_loc):
                buf[bs:padded].zero_()
            self.req_pool_indices[bs:padded].zero_()
            self.seq_lens[bs:padded].fill_(1)
            self.prefix_lens[bs:padded].zero_()
        self.backend.init_forward_metadata_cuda_graph(self._static_batch(padded))
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
