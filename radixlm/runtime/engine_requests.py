"""Client-side request state of `radixlm.Engine` (runtime/engine.py): the per-request
detokenizer and accumulated result (`Tracked`), and the checks on prompt arguments."""

from __future__ import annotations

import numbers
from typing import Any

from radixlm.errors import InvalidRequestError
from radixlm.runtime.sampling.logprobs import LogprobOptions, TokenLogprobs, empty_logprobs
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.request import ReqOutput
from radixlm.runtime.server.detokenizer import RequestDetokenizer


def is_token(value: Any) -> bool:
    """An integer token id (Python or numpy int; bool excluded)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class Tracked:
    """Per-request client-side state: detokenizer and accumulated result."""

    def __init__(self, index: int, rid: str, tokenizer, params: SamplingParams, lp):
        self.index = index
        self.rid = rid
        self.detok = RequestDetokenizer(
            tokenizer,
            params.stop,
            params.no_stop_trim,
            params.skip_special_tokens,
            params.spaces_between_special_tokens,
        )
        self.output_ids: list[int] = []
        self.chunks: list[dict[str, Any]] = []
        self.final: ReqOutput | None = None
        self.logprobs: LogprobOptions = lp
        self.input_lp: TokenLogprobs | None = None
        self.output_lp = (
            empty_logprobs(lp.top_logprobs_num, lp.token_ids_logprob) if lp.return_logprob else None
        )


def per_prompt(value: Any, n: int, name: str) -> list[Any]:
    """One value per prompt: `value` repeated, or a list of exactly n values."""
    if isinstance(value, list):
        if len(value) != n:
            raise InvalidRequestError(
                f"{len(value)} values of {name} for {n} prompts", param=name, code="invalid_value"
            )
        return list(value)
    return [value] * n


def asked_per_prompt(value: Any, n: int) -> list[list[int] | None]:
    """`token_ids_logprob` per prompt: None, one list of ids for every prompt, or a list
    of n entries that are each a list of ids or None. Element types are checked later
    (`LogprobOptions.validate`)."""
    if value is None:
        return [None] * n
    if isinstance(value, list) and value and all(v is None or isinstance(v, list) for v in value):
        return per_prompt(value, n, "token_ids_logprob")
    return [value] * n


class GenerateStream:
    """The chunks of one `Engine.generate(stream=True)` call, as its steps produce them.

    Iterating steps the engine whenever none of the call's requests has a chunk waiting
    (one step serves every request in flight; chunks for other streams stay queued for
    them). `ready()` takes the waiting chunks without stepping, for a caller that steps
    the engine itself (`Engine.step`) and serves several streams from each step. The
    requests are queued on first use, so a stream never used never runs; `close()`, a
    failed step and garbage collection abort those still running.

    Args:
        tracked: the engine's request id -> `Tracked` table (a finished request is
            removed from it once its last chunk is taken).
        submit: queues the call's requests; returns their ids.
        step: runs one scheduler step.
        abort: aborts and forgets the given request ids.
        check_open: raises EngineClosedError once the engine is shut down.
    """

    def __init__(self, tracked: dict[str, Tracked], submit, step, abort, check_open):
        self._tracked, self._submit, self._step, self._abort = tracked, submit, step, abort
        self._check_open = check_open
        self._pending: list[str] | None = None  # None: not submitted yet
        self._buffer: list[dict[str, Any]] = []

    @property
    def finished(self) -> bool:
        """True once every request's last chunk was taken (or the stream was closed)."""
        return self._pending == [] and not self._buffer

    def ready(self) -> list[dict[str, Any]]:
        """The chunks waiting now, request by request in prompt order (no step).
        Raises EngineClosedError after the engine's shutdown."""
        self._check_open()
        if self._pending is None:
            self._pending = self._submit()
        out, self._buffer = self._buffer, []
        for rid in list(self._pending):
            t = self._tracked.get(rid)
            if t is None:  # aborted by another caller: it ends without a last chunk
                self._pending.remove(rid)
                continue
            out += t.chunks
            t.chunks = []
            if t.final is not None:
                self._pending.remove(rid)
                del self._tracked[rid]
        return out

    def __iter__(self) -> GenerateStream:
        return self

    def __next__(self) -> dict[str, Any]:
        while not self._buffer:
            self._buffer = self.ready()
            if self._buffer:
                break
            if not self._pending:
                raise StopIteration
            try:
                self._step()
            except BaseException:
                self.close()
                raise
        return self._buffer.pop(0)

    def close(self) -> None:
        """Abort the requests still running; idempotent."""
        if self._pending:
            self._abort(self._pending)
        self._pending, self._buffer = [], []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - an engine already shut down has nothing to abort
            pass
