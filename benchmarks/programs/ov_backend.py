"""A radixlm.lang backend over OpenVINO GenAI's `ContinuousBatchingPipeline`, in-process.

Runs under the OpenVINO venv's interpreter (harness.py puts the repository on sys.path).
It expresses free-text gens only: `select` and constrained gens (json_schema, regex,
ebnf, dtype) raise `UnsupportedByBackendError`, so run.py gives it the text-only
workloads. Prompts are the program text tokenized by the model's Hugging Face tokenizer
(no special tokens added, as radixlm's engine does for text), passed as int64 [1, L]
token-id tensors, so the pipeline sees the same ids as radixlm; outputs are decoded by
the same tokenizer with special tokens skipped.

Program threads queue requests; one driver thread owns the pipeline: it adds the queued
requests between steps, calls `step()` while any request is live (continuous batching
with prefix caching), and resolves each request's future when its handle stops running.
The KV pool holds `kv_tokens` tokens (blocks of OV_CPU_BLOCK tokens); compute is f32.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from radixlm.lang.backend.base import Backend, OnDelta, Prompt, UnsupportedByBackendError
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.ir import SamplingOptions

OV_CPU_BLOCK = 32  # KV block of the CPU plugin (engine_harness.py's OpenVINOAdapter)


class OpenVINOBackend(Backend):
    """Programs on an exported OpenVINO IR directory (optimum-cli, fp32 weights).

    Args:
        model_dir: the IR directory (with the tokenizer files optimum-cli copies).
        threads: INFERENCE_NUM_THREADS.
        kv_tokens: KV pool size in tokens.
        chat_template: role markers (the same as radixlm's for the model).
    """

    def __init__(self, model_dir: str, threads: int, kv_tokens: int, chat_template: ChatTemplate):
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai
        from transformers import AutoTokenizer

        self.np, self.ov, self.ov_genai = np, ov, ov_genai
        sched = ov_genai.SchedulerConfig()
        sched.enable_prefix_caching = True
        sched.num_kv_blocks = -(-kv_tokens // OV_CPU_BLOCK)
        props = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
        self.pipe = ov_genai.ContinuousBatchingPipeline(model_dir, sched, "CPU", props)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self._chat_template = chat_template
        self._lock = threading.Lock()
        self._queued: list[tuple[list[int], Any, Future]] = []
        self._running = False
        self._next_id = 0

    def _load_chat_template(self) -> ChatTemplate:
        return self._chat_template

    def _config(self, options: SamplingOptions):
        for name in ("regex", "json_schema", "ebnf", "dtype"):
            if getattr(options, name) is not None:
                raise UnsupportedByBackendError(f"the OpenVINO adapter has no {name} constraint")
        cfg = self.ov_genai.GenerationConfig()
        cfg.max_new_tokens = options.max_new_tokens
        if options.ignore_eos:
            cfg.min_new_tokens, cfg.ignore_eos = options.max_new_tokens, True
        cfg.do_sample, cfg.apply_chat_template = False, False
        if options.temperature not in (None, 0, 0.0):
            raise UnsupportedByBackendError("the OpenVINO adapter runs greedy gens only")
        return cfg

    def generate(
        self, prompt: Prompt, options: SamplingOptions, on_delta: OnDelta | None = None
    ) -> tuple[str, dict[str, Any]]:
        ids = self.tok.encode(prompt.text, add_special_tokens=False)
        future: Future = Future()
        with self._lock:
            self._queued.append((ids, self._config(options), future))
            if not self._running:
                self._running = True
                threading.Thread(target=self._drive, daemon=True).start()
        out_ids = future.result()
        text = self.tok.decode(out_ids, skip_special_tokens=True)
        if on_delta is not None and text:
            on_delta(text)
        meta = {"id": None, "finish_reason": {"type": "length"}, "prompt_tokens": len(ids),
                "completion_tokens": len(out_ids), "cached_tokens": None}  # fmt: skip
        return text, meta

    def _drive(self) -> None:
        running = self.ov_genai.GenerationStatus.RUNNING
        live: list[tuple[Any, list[int], Future]] = []
        while True:
            with self._lock:
                for ids, cfg, future in self._queued:
                    tensor = self.ov.Tensor(self.np.asarray([ids], dtype=self.np.int64))
                    handle = self.pipe.add_request(self._next_id, tensor, cfg)
                    self._next_id += 1
                    live.append((handle, [], future))
                self._queued.clear()
                if not live:
                    self._running = False
                    return
            try:
                self.pipe.step()
            except Exception as e:  # noqa: BLE001 - fail every waiting program, then stop
                for _, _, future in live:
                    future.set_exception(e)
                live = []
                continue
            for entry in list(live):
                handle, out, future = entry
                if handle.can_read():
                    for o in handle.read().values():
                        out.extend(o.generated_ids)
                if handle.get_status() != running:
                    live.remove(entry)
                    future.set_result(out)
