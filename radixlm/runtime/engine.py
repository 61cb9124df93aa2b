"""`radixlm.Engine`: the in-process entry point (no HTTP) over the scheduler.

    with Engine(model="smollm2-135m") as llm:
        out = llm.generate(["Once upon a time"], {"max_new_tokens": 16, "temperature": 0})
        for chunk in llm.generate("Hello", {"max_new_tokens": 8}, stream=True):
            print(chunk["text"], end="")

The engine is single-threaded: `generate` drives scheduler steps itself until its
requests finish; concurrent streams share steps through per-request queues. A driver
that paces steps itself (requests arriving between steps, per-step timing) uses
`add_request` and `step` instead, the pattern of vLLM's `LLMEngine`:

    rid = llm.add_request("Hello", {"max_new_tokens": 8})
    while llm.has_unfinished_requests():
        for chunk in llm.step():
            print(chunk["rid"], chunk["text"])
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any

from radixlm import omp_policy
from radixlm.config import ServerArgs
from radixlm.errors import EngineClosedError, InvalidRequestError
from radixlm.runtime.engine_requests import (
    GenerateStream,
    Tracked,
    asked_per_prompt,
    is_token,
    per_prompt,
)
from radixlm.runtime.sampling.logprobs import LogprobOptions
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.request import Req, ReqOutput, SchedOptions
from radixlm.runtime.server.info import flush_cache, server_info
from radixlm.runtime.server.meta_info import finish_reason_info, logprob_info
from radixlm.runtime.server.request_checks import check_request
from radixlm.runtime.server.stack import build_stack

logger = logging.getLogger(__name__)

PromptInput = str | list[int] | list[str] | list[list[int]]


class Engine:
    """Loads a model and generates with a paged KV pool, radix cache and continuous batching.

    Args:
        model: alias (``smollm2-135m``), local Hugging Face directory or .gguf file.
        **server_args: any `ServerArgs` field (``max_total_tokens``, ``page_size``,
            ``num_threads``, ``disable_radix_cache``, ...).

    Raises:
        ModelNotFoundError: the model cannot be found (message names the install command).
        TypeError: an unknown keyword argument.
    """

    def __init__(self, model: str | None = None, **server_args: Any):
        if model is not None:
            server_args["model"] = model
        known = {f.name for f in dataclasses.fields(ServerArgs)}
        unknown = set(server_args) - known
        if unknown:
            raise TypeError(f"unknown Engine arguments: {sorted(unknown)}")
        self.args = ServerArgs(**server_args)
        stack = build_stack(self.args)
        self.config, self.tokenizer = stack.config, stack.tokenizer
        self.runner, self.scheduler = stack.runner, stack.scheduler
        self._stack = stack  # closes the other tensor-parallel ranks at shutdown
        self._tracked: dict[str, Tracked] = {}
        self._stepped: dict[str, None] = {}  # add_request's requests, in arrival order
        self._rid_counter = itertools.count()
        # Steps may run on another thread (EngineBackend's driver); an idle OpenMP pool
        # left here would make libgomp's barriers stop spinning there (omp_policy).
        omp_policy.release_thread_pool()

    # ---- public API -------------------------------------------------------------------

    def generate(
        self,
        prompt: PromptInput | None = None,
        sampling_params: SamplingParams | dict | list | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        stream: bool = False,
        cache_salt: str | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] = -1,
        top_logprobs_num: int | list[int] = 0,
        return_text_in_logprobs: bool = False,
        token_ids_logprob: list[int] | list[list[int] | None] | None = None,
        priority: int | list[int] = 0,
        slo_ttft_ms: float | None = None,
        slo_tpot_ms: float | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | GenerateStream:
        """Generate completions.

        Args:
            prompt: a string, a list of token ids, or a batch (list) of either.
            sampling_params: one setting for all prompts or a list with one per prompt
                (SamplingParams or dicts with SGLang's names: max_new_tokens, temperature,
                top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos,
                frequency_penalty, presence_penalty, repetition_penalty, logit_bias,
                min_new_tokens, no_stop_trim, skip_special_tokens,
                spaces_between_special_tokens, and at most one grammar: json_schema, regex,
                ebnf, structural_tag; runtime/sampling/grammar.py).
            input_ids: token ids instead of `prompt` (one list or a batch).
            stream: return an iterator of chunks instead of final results.
            cache_salt: prefix-cache namespace: prompts share cached prefixes only with
                requests of the same salt (None: the default namespace).
            return_logprob: also return token logprobs (log-softmax of the raw logits, see
                runtime/sampling/logprobs.py) in ``meta_info``; one value or one per prompt.
            logprob_start_len: with return_logprob, prompt logprobs from this prompt
                position (-1: none, 0: every prompt token).
            top_logprobs_num: alternatives per position (0: none).
            return_text_in_logprobs: fill the token texts of the logprob entries.
            token_ids_logprob: with return_logprob, token ids whose logprobs every
                returned position also gives (SGLang's field; meta_info's
                input_token_ids_logprobs / output_token_ids_logprobs): one list of ids
                for all prompts, or a list with one list (or None) per prompt.
            priority: higher is admitted first and retracted last (docs/slo.md); one
                value or one per prompt.
            slo_ttft_ms, slo_tpot_ms: this call's SLO targets, ms (None: the engine's
                --slo-ttft-ms / --slo-tpot-ms; they count only with SLO scheduling on).

        Returns:
            For a single prompt a dict, for a batch a list of dicts, each with ``text``,
            ``output_ids``, ``finish_reason`` (a `FinishReason`: "stop" | "length" | "abort"),
            ``matched_stop``, ``usage`` {prompt_tokens, completion_tokens,
            cached_tokens} and ``meta_info`` (the keys of ``POST /generate``'s meta_info:
            id, finish_reason, prompt_tokens, completion_tokens, cached_tokens, and with
            return_logprob the four logprob lists of `runtime/server/meta_info.py`). With
            stream=True a `GenerateStream`: an iterator of chunks with ``index``, the
            ``text`` and ``output_ids`` deltas, with return_logprob a ``meta_info``
            holding this chunk's logprob entries, and on the last chunk of each request
            ``finish_reason``, ``usage`` and ``meta_info`` (its own logprob entries).

        Raises:
            InvalidRequestError: empty prompt, bad sampling values, a grammar that does
                not compile; its subclass
                RequestTooLargeError: prompt beyond the context or prompt +
                max_new_tokens beyond the KV pool. Nothing is queued when any prompt of a
                batch is bad.
            QueueFullError: the scheduler's waiting queue is full (nothing is queued).
            SLOUnattainableError: a TTFT target the queue cannot meet, with
                --slo-admission reject (nothing is queued).
        """
        single, token_lists = self._prompts(prompt, input_ids)
        params = self._params(sampling_params, len(token_lists))
        n = len(token_lists)
        lps = [
            LogprobOptions(*values, bool(return_text_in_logprobs), asked)
            for *values, asked in zip(
                per_prompt(return_logprob, n, "return_logprob"),
                per_prompt(logprob_start_len, n, "logprob_start_len"),
                per_prompt(top_logprobs_num, n, "top_logprobs_num"),
                asked_per_prompt(token_ids_logprob, n),
            )
        ]
        sched = [
            SchedOptions(priority=prio, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
            for prio in per_prompt(priority, n, "priority")
        ]
        for ids, p, lp in zip(token_lists, params, lps):
            self._validate(ids, p)
            lp.validate(self.config.vocab_size, len(ids))
        if stream:  # submitted on first iteration: an unused stream never runs
            return self._stream(token_lists, params, cache_salt, lps, sched)
        rids = self._submit_all(token_lists, params, cache_salt, lps, sched)
        try:
            self._run_until_done(rids)
        except BaseException:  # an interrupted or failed call leaves nothing running
            self._abort(rids)
            raise
        results = [self._result(self._tracked.pop(rid)) for rid in rids]
        return results[0] if single else results

    def add_request(
        self,
        prompt: str | list[int] | None = None,
        sampling_params: SamplingParams | dict | None = None,
        input_ids: list[int] | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queue one request for `step` to serve; returns its request id.

        Nothing runs until `step` is called: requests added between two steps are
        admitted together (one prefill batch), as in vLLM's `LLMEngine.add_request`.

        Args:
            prompt: a string or a list of token ids (one prompt, not a batch).
            sampling_params: as for `generate` (one setting).
            input_ids: token ids instead of `prompt`.
            cache_salt: prefix-cache namespace, as for `generate`.

        Raises:
            InvalidRequestError: a batch of prompts, an empty prompt, bad sampling values,
                a grammar that does not compile; RequestTooLargeError (its subclass):
                prompt beyond the context or the KV pool.
            QueueFullError: the scheduler's waiting queue is full.
            Nothing is queued when it raises.
        """
        single, token_lists = self._prompts(prompt, input_ids)
        if not single:
            raise InvalidRequestError(
                "add_request takes one prompt; call it once per prompt",
                param="prompt",
                code="invalid_value",
            )
        params = self._params(sampling_params, 1)
        self._validate(token_lists[0], params[0])
        rid = self._submit_all(token_lists, params, cache_salt)[0]
        self._stepped[rid] = None
        return rid

    def step(self) -> list[dict[str, Any]]:
        """Run one scheduler step; return what it produced for `add_request`'s requests.

        Returns:
            The step's chunks, in the order the requests were added: each is a chunk of
            `generate(stream=True)` with ``rid`` (the id `add_request` returned) in
            place of ``index``: the ``text`` and ``output_ids`` deltas, and on a
            request's last chunk ``finish_reason``, ``usage`` and ``meta_info``. A
            request in a prefill step that does not finish its prompt yields nothing
            that step. Streams of `generate` share the step; their chunks stay queued
            for them.

        Raises:
            EngineClosedError: after `shutdown`.
            Exception: whatever the forward raised when the step failed; the requests of
                its batch are aborted, freed, and their last chunks (finish_reason
                `FinishReason.ABORT`) come out of the next `step`.
        """
        self._check_open()
        self._step()
        chunks: list[dict[str, Any]] = []
        for rid in list(self._stepped):
            t = self._tracked[rid]
            for chunk in t.chunks:
                del chunk["index"]
                chunk["rid"] = rid
            chunks += t.chunks
            t.chunks = []
            if t.final is not None:
                del self._stepped[rid], self._tracked[rid]
        return chunks

    def has_unfinished_requests(self) -> bool:
        """True while a request from `add_request` has not returned its last chunk."""
        return bool(self._stepped)

    def abort_request(self, rid: str) -> None:
        """Stop and free an `add_request` request (no further chunks); unknown ids are
        ignored, as are requests that already finished."""
        if rid in self._stepped:
            del self._stepped[rid]
            self._abort([rid])

    def get_server_info(self) -> dict[str, Any]:
        """Settings, KV capacity and pool counters (tokens unless stated)."""
        self._check_open()
        return server_info(self.args, self.runner, self.scheduler)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; False (nothing done) while requests are in flight."""
        self._check_open()
        ok, message = flush_cache(self.scheduler)
        if not ok:
            logger.warning(message)
        return ok

    def shutdown(self) -> None:
        """Abort everything in flight, stop any other tensor-parallel ranks and drop the
        model and pools (idempotent)."""
        if self.scheduler is not None:
            self._abort(list(self._tracked))
        self._stack.close()
        self._stepped.clear()
        self.scheduler = None
        self.runner = None

    def _check_open(self) -> None:
        if self.scheduler is None:
            raise EngineClosedError("the engine was shut down")

    def _abort(self, rids: list[str]) -> None:
        for rid in rids:
            if self._tracked.pop(rid, None) is not None and self.scheduler is not None:
                self.scheduler.abort(rid)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- internals --------------------------------------------------------------------

    def _prompts(self, prompt, input_ids) -> tuple[bool, list[list[int]]]:
        """(single, token lists) of exactly one of `prompt` and `input_ids`."""
        self._check_open()
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError(
                "pass exactly one of prompt and input_ids", param="prompt", code="invalid_value"
            )
        if isinstance(input_ids, str):
            raise InvalidRequestError(
                "input_ids must be a list of token ids, not a string",
                param="input_ids",
                code="invalid_type",
            )
        return self._tokenize(prompt if prompt is not None else input_ids)

    def _tokenize(self, value) -> tuple[bool, list[list[int]]]:
        if isinstance(value, str):
            return True, [self.encode(value)]
        if isinstance(value, list) and value and all(is_token(t) for t in value):
            return True, [[int(t) for t in value]]
        if isinstance(value, list) and value:
            out = []
            for item in value:
                if isinstance(item, str):
                    out.append(self.encode(item))
                elif isinstance(item, list) and all(is_token(t) for t in item):
                    out.append([int(t) for t in item])
                else:
                    raise InvalidRequestError(
                        "a prompt must be a string, a list of int token ids, or a list of those",
                        param="prompt",
                        code="invalid_type",
                    )
            return False, out
        if isinstance(value, list):
            raise InvalidRequestError("empty prompt list", param="prompt", code="invalid_value")
        raise InvalidRequestError(
            f"prompt must be str or list, got {type(value).__name__}",
            param="prompt",
            code="invalid_type",
        )

    def encode(self, text: str) -> list[int]:
        """A plain text prompt's ids, as `generate` tokenizes it: with the special tokens
        the tokenizer adds by default (a BOS where its post-processor adds one, e.g.
        Gemma's; none for SmolLM2, Qwen). Safe to call from any thread: encoding changes
        no tokenizer state."""
        return self.tokenizer.encode(text) if text else []

    @staticmethod
    def _params(value, n: int) -> list[SamplingParams]:
        if isinstance(value, list):
            if len(value) != n:
                raise InvalidRequestError(
                    f"{len(value)} sampling_params for {n} prompts",
                    param="sampling_params",
                    code="invalid_value",
                )
            return [SamplingParams.from_any(v) for v in value]
        return [SamplingParams.from_any(value)] * n

    def _validate(self, ids: list[int], p: SamplingParams) -> None:
        check_request(
            ids,
            p,
            vocab_size=self.config.vocab_size,
            context_len=self.runner.context_len,
            max_total_tokens=self.runner.max_total_tokens,
            page_size=self.args.page_size,
        )
        self.scheduler.grammars.compiler.validate(p)  # a bad grammar queues nothing

    def _submit_all(
        self,
        token_lists: list[list[int]],
        params: list[SamplingParams],
        cache_salt=None,
        lps: list[LogprobOptions] | None = None,
        sched: list[SchedOptions] | None = None,
    ) -> list[str]:
        rids: list[str] = []
        lps = lps or [LogprobOptions()] * len(token_lists)
        sched = sched or [SchedOptions()] * len(token_lists)
        try:
            for index, (ids, p, lp, so) in enumerate(zip(token_lists, params, lps, sched)):
                rid = f"req-{next(self._rid_counter)}"
                req = Req.new(rid, ids, p, extra_key=cache_salt, logprobs=lp, sched=so)
                self.scheduler.add_request(req)  # may raise QueueFullError
                self._tracked[rid] = Tracked(index, rid, self.tokenizer, p, lp)
                rids.append(rid)
        except BaseException:  # all or nothing: withdraw what this call queued
            self._abort(rids)
            raise
        return rids

    def _step(self) -> None:
        for out in self.scheduler.step():
            t = self._tracked.get(out.rid)
            if t is None:
                continue
            t.output_ids.extend(out.new_token_ids)
            finished = out.finish_reason is not None
            text = t.detok.add(out.new_token_ids, finished, out.matched_stop)
            chunk: dict[str, Any] = {
                "index": t.index,
                "text": text,
                "output_ids": out.new_token_ids,
            }
            delta = self._add_logprobs(t, out) if t.logprobs.return_logprob else {}
            if finished:
                t.final = out
                chunk.update(self._meta(t))
                chunk["meta_info"].update(delta)  # chunks' logprob entries add up
            elif delta:
                chunk["meta_info"] = delta
            t.chunks.append(chunk)

    def _run_until_done(self, rids: list[str]) -> None:
        while any(self._tracked[r].final is None for r in rids):
            self._step()

    def _stream(self, token_lists, params, cache_salt=None, lps=None, sched=None) -> GenerateStream:
        def submit() -> list[str]:
            return self._submit_all(token_lists, params, cache_salt, lps, sched)

        return GenerateStream(self._tracked, submit, self._step, self._abort, self._check_open)

    def _decode_token(self, t: Tracked) -> Any:
        if not t.logprobs.return_text_in_logprobs:
            return None
        return lambda tok: self.tokenizer.decode([tok])

    def _add_logprobs(self, t: Tracked, out: ReqOutput) -> dict[str, list]:
        """Accumulate this output's logprobs into `t`; return its meta_info delta."""
        if out.input_logprobs is not None:
            t.input_lp = out.input_logprobs
        if out.output_logprobs is not None:
            t.output_lp.extend(out.output_logprobs)
        return logprob_info(out.input_logprobs, out.output_logprobs, self._decode_token(t))

    def _meta(self, t: Tracked) -> dict[str, Any]:
        out = t.final
        meta: dict[str, Any] = {
            "id": t.rid,
            "finish_reason": finish_reason_info(
                out.finish_reason, out.matched_stop, out.completion_tokens
            ),
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": out.cached_tokens,
        }
        spec = {"spec_accept_length": out.spec_accept_length} if out.spec_accept_length else {}
        meta.update(spec)
        if t.logprobs.return_logprob:
            meta.update(logprob_info(t.input_lp, t.output_lp, self._decode_token(t)))
        return {
            **spec,
            "finish_reason": out.finish_reason,
            "matched_stop": out.matched_stop,
            "usage": {
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                "cached_tokens": out.cached_tokens,
            },
            "meta_info": meta,
        }

    def _result(self, t: Tracked) -> dict[str, Any]:
        assert t.final is not None
        return {"text": t.detok.text, "output_ids": list(t.output_ids), **self._meta(t)}
