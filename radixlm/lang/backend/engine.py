"""Backend over an in-process `radixlm.Engine`.

`Engine` is single-threaded, while programs call their backend from many threads. One
driver thread therefore owns every engine call; program threads queue jobs and wait on
futures. Each round the driver merges every newly queued request (gens, select scoring,
prefix commits; each with its own sampling and logprob settings) into one streamed
`engine.generate` call, so requests that arrive together are admitted and prefilled
together, then runs one scheduler step for all open calls (continuous batching) and
hands every chunk that step produced to its job before the next step: a job finishes
right after the step that finishes its own prompts, so a program's next call joins the
step after that, and a request queued mid-step joins the next round. A failed step
fails every job in flight with its error. Other calls (server info, flush) run between
rounds. After a fork (`expect_requests`) the driver holds its next round until the
branches' first requests have all arrived (at most `FORK_GATHER_S`): their threads start
one after another, and without the hold the first branches would be prefilled in one
step and the rest in the next. Likewise, after a step that finished jobs, it holds the
next round until as many new calls have arrived (at most `NEXT_CALL_GATHER_S`): the
programs' next calls, which otherwise reach the engine one step apart and leave their
programs finishing a step apart, each tail step serving fewer requests.

The driver thread exists only while jobs are pending. While programs run, call the
engine only through the program API (`engine_call`, `flush_cache`, `get_server_info`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from radixlm import omp_policy
from radixlm.lang import chat_template as templates
from radixlm.lang.backend.base import NativeBackend, OnDelta

logger = logging.getLogger(__name__)

#: Seconds the driver waits at most for the branches of a fork to send their requests.
FORK_GATHER_S = 0.05
#: Seconds the driver waits at most, after a step that finished jobs, for their programs'
#: next calls (one per finished job), so that they are prefilled together in the next step.
NEXT_CALL_GATHER_S = 0.003

_LOGPROB_LISTS = (
    "input_token_logprobs",
    "output_token_logprobs",
    "input_top_logprobs",
    "output_top_logprobs",
    "input_token_ids_logprobs",
    "output_token_ids_logprobs",
)


def native_meta(result: dict[str, Any]) -> dict[str, Any]:
    """/generate-style meta_info for an Engine result (or a stream's last chunk)."""
    if result.get("meta_info") and "finish_reason" in result["meta_info"]:
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
        "id": None,
        "finish_reason": finish,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": usage.get("cached_tokens"),
    }


class _Job:
    """One backend request (one or more prompts) and its accumulating results."""

    def __init__(
        self,
        prompts: list[str | list[int]],
        sampling_params: dict[str, Any],
        logprob: dict[str, Any] | None,
        on_delta: OnDelta | None,
        priority: int = 0,
    ):
        self.prompts = prompts
        self.priority = priority
        self.sampling_params = sampling_params
        self.logprob = logprob or {}
        self.on_delta = on_delta
        self.future: Future = Future()
        self.results = [{"text": "", "output_ids": [], "meta_info": {}} for _ in prompts]
        self.unfinished = len(prompts)

    @property
    def text_in_logprobs(self) -> bool:
        return bool(self.logprob.get("return_text_in_logprobs"))

    def add(self, index: int, chunk: dict[str, Any]) -> None:
        """Fold a chunk of prompt `index` in; completes the future after the last one."""
        r = self.results[index]
        r["text"] += chunk["text"]
        r["output_ids"] += list(chunk["output_ids"])
        meta = r["meta_info"]
        for key, value in (chunk.get("meta_info") or {}).items():
            if key in _LOGPROB_LISTS:  # each chunk carries only its own entries
                meta[key] = meta.get(key, []) + list(value)
            else:
                meta[key] = value
        if self.on_delta is not None and chunk["text"]:
            self.on_delta(chunk["text"])
        if chunk.get("finish_reason") is not None:
            meta.update({k: v for k, v in native_meta(chunk).items() if k not in meta})
            self.unfinished -= 1
            if self.unfinished == 0:
                self.future.set_result(self.results)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class _Merged:
    """One streamed `engine.generate` call (a `GenerateStream`) serving several jobs."""

    def __init__(self, stream, jobs: list[_Job]):
        self.stream = stream
        self.slots = [(job, i) for job in jobs for i in range(len(job.prompts))]
        self.jobs = jobs

    def deliver(self) -> bool:
        """Hand every chunk waiting for these jobs to them (no engine step); False once
        the call is over."""
        try:
            chunks = self.stream.ready()
        except BaseException as e:  # noqa: BLE001 - fails the jobs still running
            self.fail(e)
            return False
        for chunk in chunks:
            job, index = self.slots[chunk.get("index", 0)]
            try:
                job.add(index, chunk)
            except BaseException as e:  # noqa: BLE001 - a consumer's failure ends its job only
                job.fail(e)
        if not self.stream.finished:
            return True
        for job in self.jobs:  # normally all done; an aborted request ends here
            job.fail(RuntimeError("the engine ended the request without a result"))
        return False

    @property
    def open_jobs(self) -> int:
        """Jobs of this call not finished yet."""
        return sum(not job.future.done() for job in self.jobs)

    def fail(self, error: BaseException) -> None:
        """Abort the call's requests still running and fail its unfinished jobs."""
        self.stream.close()
        for job in self.jobs:
            job.fail(error)


def _start(engine, jobs: list[_Job]):
    """engine.generate(stream=True) over all prompts of `jobs` (validated at once)."""
    prompts, params, ret, start, top, asked, prio = [], [], [], [], [], [], []
    for job in jobs:
        for p in job.prompts:
            prompts.append(p)
            params.append(job.sampling_params)
            prio.append(job.priority)
            ret.append(bool(job.logprob.get("return_logprob")))
            start.append(job.logprob.get("logprob_start_len", -1))
            top.append(job.logprob.get("top_logprobs_num", 0))
            asked.append(job.logprob.get("token_ids_logprob"))
    kwargs: dict[str, Any] = {}
    if any(ret):  # older engines without logprob arguments still serve plain gens
        kwargs = {
            "return_logprob": ret,
            "logprob_start_len": start,
            "top_logprobs_num": top,
            "return_text_in_logprobs": jobs[0].text_in_logprobs,
        }
        if any(a is not None for a in asked):
            kwargs["token_ids_logprob"] = asked
    if any(prio):
        kwargs["priority"] = prio
    return engine.generate(prompts, params, stream=True, **kwargs)


class _Driver:
    """Runs every call of one Engine on a single thread (started on demand)."""

    def __init__(self, engine, gather_s: float = FORK_GATHER_S):
        self.engine = engine
        self.gather_s = gather_s
        self._queue: deque[_Job | Callable[[], None]] = deque()
        self._lock = threading.Condition()
        self._running = False
        self._expected = 0  # requests announced by `expect` and not yet queued
        self._deadline = 0.0  # time.monotonic() until which they are waited for

    def expect(self, n: int, within: float | None = None) -> None:
        """`n` requests are about to be queued: the next round waits for them (at most
        `within` seconds from now; default `gather_s`)."""
        with self._lock:
            self._expected += n
            wait = self.gather_s if within is None else within
            self._deadline = max(self._deadline, time.monotonic() + wait)

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` on the driver thread; returns its result or raises its error."""
        future: Future = Future()

        def task() -> None:
            try:
                future.set_result(fn(self.engine))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)

        self._put(task)
        return future.result()

    def generate(self, job: _Job) -> list[dict[str, Any]]:
        """Serve `job` alongside the others; one result dict per prompt."""
        self._put(job)
        return job.future.result()

    def _put(self, item) -> None:
        with self._lock:
            self._queue.append(item)
            if isinstance(item, _Job) and self._expected:
                self._expected -= 1
                self._lock.notify_all()
            if not self._running:
                self._running = True
                threading.Thread(
                    target=self._loop, name="radixlm-engine-driver", daemon=True
                ).start()

    def _loop(self) -> None:
        active: list[_Merged] = []
        while True:
            with self._lock:
                self._gather()
                items = list(self._queue)
                self._queue.clear()
                if not items and not active:
                    self._running = False
                    return
            jobs = [item for item in items if isinstance(item, _Job)]
            for item in items:
                if not isinstance(item, _Job):
                    item()
            for flag in (False, True):  # return_text_in_logprobs is one flag per call
                group = [job for job in jobs if job.text_in_logprobs == flag]
                if group:
                    active.extend(self._open(group))
            active = self._round(active)

    def _round(self, active: list[_Merged]) -> list[_Merged]:
        """One engine step for every open call, then every chunk it produced delivered:
        a job whose request finished gets its result before the next step, so the
        program's next call can join that step. Returns the calls still open."""
        active = [m for m in active if m.deliver()]  # queues new calls' requests
        if not active:
            return active
        try:
            self.engine.step()
        except BaseException as e:  # noqa: BLE001 - the step's requests are aborted
            for m in active:
                m.fail(e)
            return []
        before = sum(m.open_jobs for m in active)
        active = [m for m in active if m.deliver()]
        finished = before - sum(m.open_jobs for m in active)
        if finished:  # a program's next call usually follows its result within a few ms
            self.expect(finished, NEXT_CALL_GATHER_S)
        return active

    def _gather(self) -> None:
        """Wait (the lock held) until the expected requests are queued or the deadline
        passes; then expect none."""
        while self._expected > 0:
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._expected = 0
                return
            self._lock.wait(left)

    def _open(self, jobs: list[_Job]) -> list[_Merged]:
        """Start `jobs` as one merged stream; if the engine refuses it (one bad prompt
        refuses the whole call), start each job alone so only the bad ones fail."""
        try:
            return [_Merged(_start(self.engine, jobs), jobs)]
        except BaseException as e:  # noqa: BLE001 - handed to the jobs
            if len(jobs) == 1:
                jobs[0].fail(e)
                return []
        return [m for job in jobs for m in self._open([job])]


class EngineBackend(NativeBackend):
    """Programs on an in-process `radixlm.Engine` (use `for_engine` to share one per engine).

    Args:
        engine: a `radixlm.Engine`.
        chat_template: role markers; default: derived from the engine's tokenizer.
    """

    def __init__(self, engine, chat_template: templates.ChatTemplate | None = None):
        self.engine = engine
        self._driver = _Driver(engine)
        # The driver thread runs the steps from now on; this thread's OpenMP pool, if the
        # engine ran here since it was built, would stop libgomp spinning (omp_policy).
        omp_policy.release_thread_pool()
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

    def request(self, *, text=None, input_ids=None, sampling_params, logprob=None, priority=0):
        return self._generate(text, input_ids, sampling_params, logprob, None, priority)

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        return [self.engine.encode(t) for t in texts]  # thread-safe (Engine.encode)

    def request_stream(self, text, sampling_params, on_delta, priority=0):
        return self._generate([text], None, sampling_params, None, on_delta, priority)[0]

    def _generate(self, text, input_ids, sampling_params, logprob, on_delta, priority=0):
        prompts = list(text) if text is not None else [list(ids) for ids in input_ids]
        job = _Job(prompts, sampling_params, logprob, on_delta, priority)
        return self._driver.generate(job)

    def engine_call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` on the thread that owns the engine (safe while programs run);
        returns its result or raises its exception."""
        return self._driver.call(fn)

    def expect_requests(self, n: int) -> None:
        self._driver.expect(n)

    def flush_cache(self) -> bool:
        return self._driver.call(lambda engine: engine.flush_cache())

    def get_server_info(self) -> dict[str, Any]:
        return self._driver.call(lambda engine: engine.get_server_info())
