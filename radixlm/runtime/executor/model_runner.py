"""ModelRunner: loads the model, sizes and owns the memory pools, runs forward steps."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import torch

from radixlm.config import ServerArgs
from radixlm.kernels import (
    ForwardBatch,
    ForwardMode,
    create_attention_backend,
    resolve_attention_backend,
    resolve_device,
)
from radixlm.kernels.cpu import CpuKernels
from radixlm.runtime.executor.expert_stats import ExpertStats
from radixlm.runtime.executor.kv_cache_dtype import (
    kv_cache_dtype,
    read_kv_scales,
)
from radixlm.runtime.executor.layers import CudaLayers, LayerFactory, cpu_layers
from radixlm.runtime.executor.layers.cpu_linear import CheckpointPanels, FloatPanels, GgufPanels
from radixlm.runtime.executor.layers.tensor_parallel import TensorParallelLayers
from radixlm.runtime.executor.memory import (
    PagedAllocator,
    ReqToTokenPool,
    available_memory_bytes,
    kv_capacity_tokens,
)
from radixlm.runtime.executor.model_registry import resolve_model_path
from radixlm.runtime.executor.parallel import step_broadcast
from radixlm.runtime.executor.parallel.group import RankFailedError, TPGroup, rank_device
from radixlm.runtime.executor.weights import build_model, load_weights, weights_bytes

logger = logging.getLogger(__name__)

#: Seconds a failed collective waits for the watchdog to name the rank that died.
_FAILURE_WAIT_S = 3.0

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Owns the model, the KV pool, the allocator and the request-to-token table.

    Capacity: `max_total_tokens` if set, else
    (available memory * mem_fraction - weights bytes - weight copy bytes) / KV bytes per
    token, rounded down to a page (the copy: the CPU head's second layout). Raises
    ValueError when the budget leaves no room for a single page.

    Tensor parallelism (`tp`, a joined group of `args.tp_size` ranks): this runner holds
    rank `tp.rank`'s shard (`TensorParallelLayers`) and KV pool of its heads; the figures
    above are per rank, with the available memory per rank (a GPU's free memory; on the
    CPU, whose memory the ranks share, 1/N of the host's) and the smallest capacity of any
    rank taken by all. Rank 0's `forward` and `copy_kv_slots` first send the step to the
    other ranks (`parallel/step_broadcast.py`), which replay it through the same methods;
    its logits are the whole vocabulary's, gathered from the ranks.
    """

    def __init__(self, args: ServerArgs, hf_dir, config, tp: TPGroup | None = None):
        self.args = args
        self.config = config
        #: The tensor-parallel group, None without tensor parallelism.
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.device = resolve_device(args.device)
        if self.tp is not None:
            self.device = rank_device(self.device, self.tp.rank)
        self.dtype = _DTYPES[args.dtype]
        kv_dtype = kv_cache_dtype(args.kv_cache_dtype, self.dtype)
        #: The attention backend's registered name (checked before the model loads).
        self.attention_backend = resolve_attention_backend(
            args.attention_backend, self.device, args.dtype, kv_dtype
        )
        #: What the model is built of (`executor/layers/`), chosen before it is built.
        self.layers = self._layer_factory(hf_dir)
        self.model = load_weights(
            build_model(config, self.layers), hf_dir, config, self.dtype, self.device
        )
        self.weights_bytes = weights_bytes(self.model)
        self.layers.process_weights_after_loading(self.model)
        # CPU layouts may keep a second layout of the head (packed panels, a transposed
        # copy); it comes out of the KV budget like the weights.
        self.weight_copy_bytes = self.layers.copy_bytes(self.model)
        self.weights_bytes -= self.layers.saved_bytes(self.model)
        #: The CPU weight layout in use ("packed" panels and C kernels, or "input-major"
        #: for torch's GEMM); None on CUDA.
        self.cpu_layout: str | None = self.layers.cpu_layout
        #: The packed layout's weight format after `--weight-format auto` ("gguf" or
        #: "fp32"; None without packed panels), and how many projections it keeps as
        #: quantized GGUF panels.
        self.weight_format: str | None = self.layers.weight_format
        self.quantized_weights = self.layers.quantized_weights
        #: Distinct experts per decode step by batch size (a dense model: empty, falsy).
        self.expert_stats = ExpertStats(self.model)

        attn = self.model.model.layers[0].self_attn
        #: KV bytes per token as the model's own pool stores them (`create_kv_pool`).
        self.kv_bytes_per_token = self.model.kv_bytes_per_token(kv_dtype)
        if args.max_total_tokens is not None:
            self.max_total_tokens = args.max_total_tokens // args.page_size * args.page_size
            self.kv_budget_bytes = self.max_total_tokens * self.kv_bytes_per_token
        else:
            held = self.weights_bytes + self.weight_copy_bytes
            budget = int(self._available_bytes() * args.mem_fraction) - held
            if self.tp is not None:
                budget = self.tp.min_int(budget)
            self.kv_budget_bytes = max(budget, 0)
            self.max_total_tokens = kv_capacity_tokens(
                self.kv_budget_bytes, self.kv_bytes_per_token, args.page_size
            )
        if self.max_total_tokens < args.page_size:
            raise ValueError(
                "the memory budget leaves no room for the KV cache; "
                "raise --mem-fraction or set --max-total-tokens"
            )
        self.context_len = args.context_length or config.max_position_embeddings
        if self.context_len > config.max_position_embeddings:
            logger.warning(
                "context_length %d exceeds the model's %d positions; quality may degrade",
                self.context_len,
                config.max_position_embeddings,
            )
        kv_start = time.perf_counter()
        self.kv_pool = self.model.create_kv_pool(
            self.max_total_tokens + args.page_size, kv_dtype, self.device, args.page_size
        )
        kv_seconds = time.perf_counter() - kv_start
        if self.kv_pool.kv_scales is not None:
            scales = read_kv_scales(hf_dir, len(self.kv_pool.k_buffer))
            if scales is not None:
                self.kv_pool.use_scales(scales)
        self.allocator = PagedAllocator(self.max_total_tokens, args.page_size)
        # The scheduler reads and writes the table on the host; on CUDA each step copies its
        # requests' rows into a device mirror that the kernels (and CUDA graphs) read.
        self.req_to_token_pool = ReqToTokenPool(args.max_running_requests, self.context_len + 1)
        host_table = self.req_to_token_pool.req_to_token
        self.device_req_to_token = (
            host_table if self.device == "cpu" else torch.zeros_like(host_table, device=self.device)
        )
        self.backend = create_attention_backend(
            self.attention_backend,
            self.kv_pool,
            attn.scaling,
            num_heads=attn.num_heads,
            page_size=args.page_size,
            dtype=self.dtype,
            sliding_windows=[layer.self_attn.sliding_window for layer in self.model.model.layers],
        )
        self.graph_runner = None
        if self._use_cuda_graph():
            from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(
                self.model,
                self.backend,
                self.device_req_to_token,
                min(args.cuda_graph_max_bs, args.max_running_requests),
            )
        logger.info(
            "weights %.1f MB, KV %d bytes/token, capacity %d tokens (%.1f full-context users), "
            "KV pool of %.1f MB allocated in %.2f s",
            self.weights_bytes / 1e6,
            self.kv_bytes_per_token,
            self.max_total_tokens,
            self.max_total_tokens / self.context_len,
            self.max_total_tokens * self.kv_bytes_per_token / 1e6,
            kv_seconds,
        )

    def _layer_factory(self, hf_dir) -> LayerFactory:
        """What the model is built of: plain torch (`CudaLayers`) off the CPU; on CPU the
        packed layout (C kernels unless `--cpu-gemm torch`, fp32, panels per
        `--weight-format`) or the input-major one (`cpu_layers`); a rank's shard
        (`TensorParallelLayers`, plain torch on every device) under tensor parallelism.
        Raises ValueError for `--weight-format gguf` where it cannot apply."""
        if self.tp is not None:
            if self.args.weight_format == "gguf":
                raise ValueError("--weight-format gguf does not run with --tp-size > 1")
            return TensorParallelLayers(self.tp, self.config, self.args.ep_size > 1)
        if self.device != "cpu":
            if self.args.weight_format == "gguf":
                raise ValueError("--weight-format gguf runs on CPU only (radixlm's CPU kernels)")
            from radixlm.runtime.executor.quant import load_quantized

            return CudaLayers(load_quantized(hf_dir, self.config))
        gemm = CpuKernels.load() if self.args.cpu_gemm == "auto" else None
        source = self._panel_source(gemm, hf_dir)
        return cpu_layers(
            gemm, self.dtype, source, lm_head_screen=not self.args.disable_lm_head_screen
        )

    def _panel_source(self, kernels: CpuKernels | None, hf_dir) -> FloatPanels:
        """How the packed layout stores projections (`--weight-format`): `GgufPanels` over
        the model file's blocks, `CheckpointPanels` over a quantized checkpoint's weights
        ('auto' with the C kernels and fp32), or fp32 panels. Raises ValueError for 'gguf'
        where it cannot apply (no C kernels, not a .gguf model, not fp32)."""
        fmt = self.args.weight_format
        if fmt == "fp32":
            return FloatPanels()
        quantized = getattr(self.config, "quantization_config", None) is not None
        if quantized and fmt == "auto" and kernels is not None and self.dtype == torch.float32:
            from radixlm.runtime.executor.quant import load_quantized

            return CheckpointPanels(load_quantized(hf_dir, self.config))
        path = resolve_model_path(self.args.model)
        reason = None
        if kernels is None:
            reason = "radixlm's CPU kernels are not in use (--cpu-gemm torch, or they cannot run)"
        elif path.suffix != ".gguf":
            reason = f"{self.args.model} is not a .gguf model"
        elif self.dtype != torch.float32:
            reason = "--dtype is not float32"
        if reason is not None:
            if fmt == "gguf":
                raise ValueError(f"--weight-format gguf: {reason}")
            return FloatPanels()
        from radixlm.runtime.executor.gguf_blocks import load_blocks

        return GgufPanels(load_blocks(path, hf_dir, self.config))

    def _available_bytes(self) -> int:
        """Free memory on the model's device (host MemAvailable on CPU, divided among the
        tensor-parallel ranks that share it)."""
        if self.device == "cpu":
            return available_memory_bytes() // (self.tp.size if self.tp else 1)
        return torch.cuda.mem_get_info(torch.device(self.device))[0] + self.weights_bytes

    def _use_cuda_graph(self) -> bool:
        """Decode graphs: on by default on CUDA for backends whose metadata allows them;
        off under tensor parallelism (a replayed graph would not send the step to the other
        ranks, whose collectives must match rank 0's)."""
        return (
            self.tp is None
            and str(self.device).startswith("cuda")
            and not self.args.disable_cuda_graph
            and self.backend.supports_cuda_graph
        )

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Run one step; returns float32 logits [B, vocab] of each request's last token.

        `fb` may hold CPU index tensors (the scheduler builds them there); they are moved to
        the model's device. Logits come back on the CPU, where the sampler runs. Under
        tensor parallelism rank 0 first sends `fb` to the other ranks; it raises
        RankFailedError naming a rank that died (the other ranks' logits are their own
        vocabulary part, unused).
        """
        if self.tp is not None and self.tp.rank == 0:
            with self._collectives():
                step_broadcast.send_forward(self.tp, fb)
                return self._forward(fb)
        return self._forward(fb)

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.device != "cpu":
            fb = self._to_device(fb)
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            logits = self.model(fb, self.backend)
            if self.expert_stats and fb.mode is ForwardMode.DECODE:
                self.expert_stats.after_decode(fb.seq_lens.shape[0])
        return logits.cpu()

    def copy_kv_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's K/V rows of slots `src` into slots `dst` (int64 [n]; they may
        overlap), on every tensor-parallel rank. Raises RankFailedError as `forward`."""
        if self.tp is not None and self.tp.rank == 0:
            with self._collectives():
                step_broadcast.send_copy_slots(self.tp, src, dst)
        device = self.kv_pool.k_buffer[0].device
        self.kv_pool.copy_slots(src.to(device), dst.to(device))

    @contextlib.contextmanager
    def _collectives(self):
        """Turn a collective's failure into RankFailedError naming the failed rank (the
        watchdog's finding) when one is known."""
        failed = self.tp.failure()
        if failed is not None:
            raise RankFailedError(failed)
        try:
            yield
        except RuntimeError as exc:
            # A peer's exit breaks the collective at once; its watchdog notes it soon after.
            deadline = time.monotonic() + _FAILURE_WAIT_S
            while (failed := self.tp.failure()) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if failed is None:
                raise
            raise RankFailedError(failed) from exc

    def _to_device(self, fb: ForwardBatch) -> ForwardBatch:
        """Copy the batch's table rows (first max(seq_lens) columns) into the device mirror
        and move the index tensors to the device."""
        max_len = int(fb.seq_lens.max())
        rows = fb.req_pool_indices
        self.device_req_to_token[rows.to(self.device), :max_len] = fb.req_to_token[
            rows, :max_len
        ].to(self.device)
        return dataclasses.replace(fb, req_to_token=self.device_req_to_token).to(self.device)

    def capture_hidden_states(self) -> None:
        """Make every later forward keep the model's final hidden states (`last_hidden`),
        which speculative drafters reading target features (EAGLE) consume. Drops the CUDA
        graph runner: a replayed decode graph runs no Python, so it would leave them stale."""
        self.model.capture_hidden = True
        self.graph_runner = None

    def last_hidden(self) -> torch.Tensor | None:
        """Final-norm hidden states (float [T, hidden], model dtype and device) of the T
        tokens of the last forward, captured since `capture_hidden_states()`; None before,
        or for a model that does not capture them."""
        return getattr(self.model, "last_hidden", None)
