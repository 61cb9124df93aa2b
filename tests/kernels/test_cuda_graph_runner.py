"""The decode CUDA-graph runner's batching logic on CPU: padding to captured sizes, static
buffers, per-replay metadata. Graph capture is replaced by re-running the recorded step,
so what is checked is everything around the graph."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import LlamaConfig

from radixlm.kernels import ForwardBatch, ForwardMode, create_attention_backend
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes
from radixlm.runtime.executor.layers import TorchLayers
from radixlm.runtime.executor.memory import KVPool
from radixlm.runtime.executor.models.llama import LlamaForCausalLM
from tests.kernels import fake_flashinfer


class _Replay:
    """Stands in for a CUDA graph: replay re-runs the step into the captured output."""

    def __init__(self, step, out):
        self.step, self.out = step, out

    def replay(self):
        with torch.inference_mode():
            self.out.copy_(self.step())


class _EagerGraphRunner(CudaGraphRunner):
    def _record(self, step):
        out = step()
        return _Replay(step, out), out


def test_capture_batch_sizes():
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]


def _decode_batch(table: torch.Tensor, lens: list[int], rows: list[int]) -> ForwardBatch:
    seq = torch.tensor(lens)
    rows_t = torch.tensor(rows)
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=torch.tensor([11, 22, 33, 44][: len(lens)]),
        positions=seq - 1,
        out_cache_loc=table[rows_t, seq - 1].to(torch.int64),
        req_pool_indices=rows_t,
        seq_lens=seq,
        extend_prefix_lens=seq - 1,
        extend_seq_lens=torch.ones_like(seq),
        req_to_token=table,
    )


@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
def test_padded_replay_equals_eager_decode(backend_name, device, monkeypatch):
    """Also the FlashInfer path (per-size graph wrappers, planned before each replay), with
    the torch stand-in for flashinfer on CPU."""
    if backend_name == "flashinfer":
        if device != "cpu":
            pytest.skip("the stand-in runs on CPU; test_gpu.py covers real FlashInfer")
        monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config, TorchLayers()).eval().to(device)
    pool = KVPool(200, 2, 1, 16, torch.float32, device)
    for buf in pool.k_buffer + pool.v_buffer:
        buf[1:].normal_()
    table = torch.zeros(6, 32, dtype=torch.int32)
    table[:, :30] = torch.randperm(199)[:180].view(6, 30).to(torch.int32) + 1
    table = table.to(device)
    backend = create_attention_backend(
        backend_name, pool, 16**-0.5, num_heads=3, page_size=1, dtype=torch.float32
    )
    runner = _EagerGraphRunner(model, backend, table, max_bs=4)
    assert sorted(runner.graphs) == [1, 2, 4]
    for lens, rows in (([20, 3, 8, 6], [3, 1, 5, 0]), ([5, 9, 17], [4, 0, 2])):
        fb = _decode_batch(table.cpu(), lens, rows).to(device)
        backend.init_forward_metadata(fb)
        want = model(fb, backend)
        got = runner.replay(fb)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The batch of 3 ran padded to 4: its padding row decodes at slot 0 with one key.
    assert (runner.seq_lens[3].item(), runner.out_cache_loc[3].item()) == (1, 0)
