"""Backend over an in-process `radixlm.Engine`.

`Engine` is single-threaded, while programs call their backend from many threads. One
driver thread therefore owns every engine call: program threads queue jobs and wait on
futures. Gens become engine streams that the driver advances together, one scheduler
step for all of them per round, so concurrent programs share batches (continuous
batching) and a request queued mid-step joins the next one. Blocking calls (scoring
with logprobs, cache commits, server info) run between rounds; the streams' requests
keep advancing during their steps because the scheduler is shared.

The driver thread exists only while jobs are pending. While programs run, call the
engine only through the program API (or `flush_cache` / `get_server_info` here).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from radixlm.lang import chat_template as templates
from radixlm.lang.backend.base import NativeBackend, OnDelta

logger = logging.getLogger(__name__)

_LOGPROB_KEYS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


_LOGPROB_LISTS = (
    "input_token_logprobs",
    "output_token_logprobs",
    "input_top_logprobs",
    "output_top_logprobs",
)


class _StreamJob:
    """One `engine.generate(..., stream=True)` call (one or more prompts): chunks are
    accumulated per prompt; text deltas of a single prompt also go to `on_delta`."""

    def __init__(self, kwargs: dict[str, Any], num_prompts: int, on_delta: OnDelta | None):
        self.kwargs = kwargs
        self.on_delta = on_delta
        self.future: Future = Future()
        self.stream: Iterator[dict[str, Any]] | None = None
        self.results: list[dict[str, Any]] = [
            {"text": "", "output_ids": [], "meta_info": {}} for _ in range(num_prompts)
        ]

    def add(self, chunk: dict[str, Any]) -> None:
        r = self.results[chunk.get("index", 0)]
        r["text"] += chunk["text"]
        r["output_ids"] += list(chunk["output_ids"])
        meta = r["meta_info"]
        for key, value in (chunk.get("meta_info") or {}).items():
            if key in _LOGPROB_LISTS:  # each chunk carries its own entries
                meta[key] = meta.get(key, []) + list(value)
            else:
                meta[key] = value
        if chunk.get("finish_reason") is not None and "finish_reason" not in meta:
            meta.update(native_meta(chunk))
        if self.on_delta is not None and chunk["text"]:
            self.on_delta(chunk["text"])


class _Driver:
    """Runs every call of one Engine on a single thread (started on demand)."""

    def __init__(self, engine):
        self.engine = engine
        self._jobs: deque[Callable[[list[_StreamJob]], None]] = deque()
        self._lock = threading.Lock()
        self._running = False

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` on the driver thread; returns its result or raises its error."""
        future: Future = Future()

        def job(active: list[_StreamJob]) -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    future.set_exception(e)

        self._submit(job)
        return future.result()

    def stream(
        self, kwargs: dict[str, Any], num_prompts: int, on_delta: OnDelta | None = None
    ) -> list[dict[str, Any]]:
        """Run ``engine.generate(**kwargs, stream=True)`` alongside the other streams;
        returns one result dict (text, output_ids, meta_info) per prompt."""
        s = _StreamJob(kwargs, num_prompts, on_delta)

        def job(active: list[_StreamJob]) -> None:
            try:
                s.stream = self.engine.generate(**s.kwargs, stream=True)
            except BaseException as e:  # noqa: BLE001 - validation errors go to the caller
                s.future.set_exception(e)
                return
            active.append(s)

        self._submit(job)
        return s.future.result()

    def _submit(self, job) -> None:
        with self._lock:
            self._jobs.append(job)
            if not self._running:
                self._running = True
                threading.Thread(
                    target=self._loop, name="radixlm-engine-driver", daemon=True
                ).start()

    def _loop(self) -> None:
        active: list[_StreamJob] = []
        while True:
            with self._lock:
                jobs = list(self._jobs)
                self._jobs.clear()
                if not jobs and not active:
                    self._running = False
                    return
            for job in jobs:
                job(active)
            for s in list(active):
                if not self._advance(s):
                    active.remove(s)

    @staticmethod
    def _advance(s: _StreamJob) -> bool:
        """Take one chunk from `s` (stepping the engine when none is ready); False once
        it has finished or failed."""
        try:
            chunk = next(s.stream)
        except StopIteration:
            s.future.set_result(s.results)
            return False
        except BaseException as e:  # noqa: BLE001 - fails this request only
            s.future.set_exception(e)
            return False
        try:
            s.add(chunk)
        except BaseException as e:  # noqa: BLE001 - a consumer's failure ends its request
            s.future.set_exception(e)
            s.stream.close()
            return False
        return True


def native_meta(result: dict[str, Any]) -> dict[str, Any]:
    """/generate-style meta_info for an Engine result (or a stream's last chunk)."""
    if result.get("meta_info"):
        return dict(result["meta_info"])
    usage = result.get("usage") or {}
    reason = result.get("finish_reason")
    if reason == "stop":
        finish = {"type": "stop", "matched": result.get("matched_stop")}
    elif reason == "length":
        finish = {"type": "length", "length": usage.get("completion_tokens")}
    else:
        finish = None if reason is None else {"type": reason}
    return {
        "id": result.get("rid"),
        "finish_reason": finish,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": usage.get("cached_tokens"),
    }


class EngineBackend(NativeBackend):
    """Programs on an in-process `radixlm.Engine` (use `for_engine` to share one per engine).

    Args:
        engine: a `radixlm.Engine`.
        chat_template: role markers; default: derived from the engine's tokenizer.
    """

    def __init__(self, engine, chat_template: templates.ChatTemplate | None = None):
        self.engine = engine
        self._driver = _Driver(engine)
        self._chat_template = chat_template

    @classmethod
    def for_engine(cls, engine) -> EngineBackend:
        """The backend attached to `engine` (created on first use)."""
        backend = engine.__dict__.get("_radixlm_lang_backend")
        if backend is None:
            backend = cls(engine)
            engine.__dict__["_radixlm_lang_backend"] = backend
        return backend

    def _load_chat_template(self) -> templates.ChatTemplate:
        return templates.from_tokenizer(self.engine.tokenizer)

    def request(self, *, text=None, input_ids=None, sampling_params, logprob=None):
        return self._generate(text, input_ids, sampling_params, logprob, None)

    def request_stream(self, text, sampling_params, on_delta):
        return self._generate([text], None, sampling_params, None, on_delta)[0]

    def _generate(self, text, input_ids, sampling_params, logprob, on_delta):
        kwargs: dict[str, Any] = {"sampling_params": sampling_params}
        if text is not None:
            kwargs["prompt"] = list(text)
        if input_ids is not None:
            kwargs["input_ids"] = [list(ids) for ids in input_ids]
        kwargs.update({k: v for k, v in (logprob or {}).items() if k in _LOGPROB_KEYS})
        prompts = kwargs.get("prompt", kwargs.get("input_ids"))
        return self._driver.stream(kwargs, len(prompts), on_delta)

    def engine_call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` on the thread that owns the engine (safe while programs run);
        returns its result or raises its exception."""
        return self._driver.call(fn)

    def flush_cache(self) -> bool:
        return self._driver.call(lambda engine: engine.flush_cache())

    def get_server_info(self) -> dict[str, Any]:
        return self._driver.call(lambda engine: engine.get_server_info())
