"""A radixlm.lang backend over OpenVINO GenAI's `ContinuousBatchingPipeline`, in-process.

Runs under the OpenVINO venv's interpreter (harness.py puts the repository on sys.path).
Free-text gens, json_schema and regex gens (the pipeline's `StructuredOutputConfig`),
and `select` as greedy decoding constrained to the regex alternation of the choices
(like the OpenAI backend's dialects: not radixlm's logprob scoring, so it may pick
another choice); ebnf and dtype raise `UnsupportedByBackendError`. Prompts are the
program text tokenized by the model's Hugging Face tokenizer (no special tokens added,
as radixlm's engine does for text), passed as int64 [1, L] token-id tensors, so the
pipeline sees the same ids as radixlm; outputs are decoded by the same tokenizer with
special tokens skipped.

Program threads queue requests; one driver thread owns the pipeline: it adds the queued
requests between steps, calls `step()` while any request is live (continuous batching
with prefix caching), and resolves each request's future when its handle stops running.
The KV pool holds `kv_tokens` tokens (blocks of OV_CPU_BLOCK tokens); compute is f32.
With `prompt_lookup` the pipeline drafts by prompt lookup (OpenVINO GenAI's n-gram
speculation, `prompt_lookup=True`) with LOOKUP_TOKENS drafts from LOOKUP_NGRAM-grams.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import Future
from typing import Any

from radixlm.errors import ServerError
from radixlm.lang.backend.base import (
    Backend,
    OnDelta,
    Prompt,
    UnsupportedByBackendError,
    check_choices,
)
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import ChoicesDecision
from radixlm.lang.ir import SamplingOptions

OV_CPU_BLOCK = 32  # KV block of the CPU plugin (engine_harness.py's OpenVINOAdapter)
# Prompt lookup: draft tokens per step and the longest n-gram matched (OpenVINO GenAI's
# prompt lookup sample uses these values).
LOOKUP_TOKENS, LOOKUP_NGRAM = 5, 3


class OpenVINOBackend(Backend):
    """Programs on an exported OpenVINO IR directory (optimum-cli, fp32 weights).

    Args:
        model_dir: the IR directory (with the tokenizer files optimum-cli copies).
        threads: INFERENCE_NUM_THREADS.
        kv_tokens: KV pool size in tokens.
        chat_template: role markers (the same as radixlm's for the model).
        prompt_lookup: draft by prompt lookup (n-gram speculation).
    """

    def __init__(
        self,
        model_dir: str,
        threads: int,
        kv_tokens: int,
        chat_template: ChatTemplate,
        prompt_lookup: bool = False,
    ):
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai
        from transformers import AutoTokenizer

        self.np, self.ov, self.ov_genai = np, ov, ov_genai
        sched = ov_genai.SchedulerConfig()
        sched.enable_prefix_caching = True
        sched.num_kv_blocks = -(-kv_tokens // OV_CPU_BLOCK)
        props = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
        if prompt_lookup:
            props["prompt_lookup"] = True
        self.prompt_lookup = prompt_lookup
        self.pipe = ov_genai.ContinuousBatchingPipeline(model_dir, sched, "CPU", props)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self._chat_template = chat_template
        self._lock = threading.Lock()
        self._queued: list[tuple[list[int], Any, Future]] = []
        self._running = False
        self._next_id = 0

    def _load_chat_template(self) -> ChatTemplate:
        return self._chat_template

    def _config(
        self, max_new_tokens: int, ignore_eos: bool, json_schema: str | None, regex: str | None
    ):
        cfg = self.ov_genai.GenerationConfig()
        cfg.max_new_tokens = max_new_tokens
        if ignore_eos:
            cfg.min_new_tokens, cfg.ignore_eos = max_new_tokens, True
        cfg.do_sample, cfg.apply_chat_template = False, False
        if self.prompt_lookup:
            cfg.num_assistant_tokens, cfg.max_ngram_size = LOOKUP_TOKENS, LOOKUP_NGRAM
        if json_schema is not None or regex is not None:
            so = self.ov_genai.StructuredOutputConfig()
            if json_schema is not None:
                so.json_schema = json_schema
            else:
                so.regex = regex
            cfg.structured_output_config = so
        return cfg

    def generate(
        self, prompt: Prompt, options: SamplingOptions, on_delta: OnDelta | None = None
    ) -> tuple[str, dict[str, Any]]:
        for name in ("ebnf", "dtype"):
            if getattr(options, name) is not None:
                raise UnsupportedByBackendError(f"the OpenVINO adapter has no {name} constraint")
        if options.temperature not in (None, 0, 0.0):
            raise UnsupportedByBackendError("the OpenVINO adapter runs greedy gens only")
        cfg = self._config(options.max_new_tokens, bool(options.ignore_eos),
                           options.json_schema, options.regex)  # fmt: skip
        ids, out_ids = self._run(prompt.text, cfg)
        text = self.tok.decode(out_ids, skip_special_tokens=True)
        if on_delta is not None and text:
            on_delta(text)
        meta = {"id": None, "finish_reason": {"type": "length"}, "prompt_tokens": len(ids),
                "completion_tokens": len(out_ids), "cached_tokens": None}  # fmt: skip
        return text, meta

    def select(self, prompt, choices, temperature, method, rng=None) -> ChoicesDecision:
        """Greedy decoding constrained to `choices` (`temperature`, `method` unused).
        Raises ServerError when the decoded text is not one of them."""
        choices = check_choices(choices)
        regex = "(" + "|".join(re.escape(c) for c in choices) + ")"
        cfg = self._config(max(map(len, choices)) + 4, False, None, regex)
        _, out_ids = self._run(prompt, cfg)
        text = self.tok.decode(out_ids, skip_special_tokens=True)
        if text not in choices:
            raise ServerError(f"constrained select answered {text!r}, not one of {choices}")
        return ChoicesDecision(text, {"method": "constrained decoding"})

    def _run(self, text: str, cfg) -> tuple[list[int], list[int]]:
        """(prompt ids, output ids) of one request, run by the driver thread."""
        ids = self.tok.encode(text, add_special_tokens=False)
        future: Future = Future()
        with self._lock:
            self._queued.append((ids, cfg, future))
            if not self._running:
                self._running = True
                threading.Thread(target=self._drive, daemon=True).start()
        return ids, future.result()

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
