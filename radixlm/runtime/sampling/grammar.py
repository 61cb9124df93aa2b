"""Grammar-constrained decoding with xgrammar: JSON schema, regex, EBNF, structural tags.

A request carries at most one grammar spec in its `SamplingParams` (`json_schema`,
`regex`, `ebnf` or `structural_tag`, SGLang's names). `GrammarCompiler` turns a spec
into an xgrammar `CompiledGrammar` (cached by ``(kind, spec)``); `GrammarBackend` is the
scheduler's strategy object: it gives each constrained request its own
`xgrammar.GrammarMatcher`, masks the logits rows of constrained requests before
sampling (the vocabulary bitmask of Dong et al. 2024, "XGrammar: Flexible and
Efficient Structured Generation Engine for Large Language Models"), and advances the
matcher with each sampled token. Requests without a grammar cost one attribute check
per step. A grammar not yet in the cache compiles on a worker thread
(`GrammarBackend.start`), so the scheduler keeps stepping the running requests meanwhile.

Limits: a spec longer than `MAX_SPEC_CHARS` is refused before compiling. With a
`compile_timeout` (the HTTP process's, ``--grammar-compile-timeout``; `Engine` sets none),
the admission check `GrammarCompiler.validate` waits at most that long and then refuses
the request. Its compiles run on threads of their own, at most `TIMED_COMPILES` at once:
xgrammar cannot stop a compile, so one keeps its thread until it ends even after its
request was refused, and a spec that gets no thread within the timeout is refused as a
busy server (ServerError) without being compiled. A compile that itself took longer
than the timeout is cached as that refusal (while it stays in the LRU), so the spec is
refused at once when sent again and never reaches the scheduler. The scheduler
compiles on `COMPILE_WORKERS` threads, none of which waits for another's compile.

Invariant: a request's matcher has accepted exactly its ``output_ids``. A retracted
request keeps its matcher and re-prefills prompt + output without sampling, so the
invariant holds when it resumes; an aborted request simply drops its matcher.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from radixlm.errors import InvalidRequestError, ServerError
from radixlm.runtime.sampling.sampler import GRAMMAR_FIELDS, SamplingParams
from radixlm.runtime.sampling.schema_refs import structural_tag_ref, unresolvable_ref

logger = logging.getLogger(__name__)

# A xgrammar error message starts with "[hh:mm:ss] /path/file.cc:line: ".
_XGR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")

#: Longest grammar spec (characters) compiled. Compile time grows with the spec: a
#: literal regex of a million characters keeps a core busy for minutes.
MAX_SPEC_CHARS = 256 * 1024

#: Scheduler threads compiling grammars at once, so one slow compile does not hold back
#: the grammars of the requests behind it.
COMPILE_WORKERS = 4

#: `GrammarCompiler.validate` compiles running at once (module doc).
TIMED_COMPILES = 4

#: Bytes of xgrammar's compiler cache (compiled rules and token masks shared across specs).
XGR_CACHE_BYTES = 64 * 1024 * 1024


def grammar_spec(params: SamplingParams) -> tuple[str, str] | None:
    """``(kind, spec)`` of the request's grammar (kind is a `GRAMMAR_FIELDS` name), or None.

    SamplingParams.validate guarantees at most one of the fields is set.
    """
    for kind in GRAMMAR_FIELDS:
        spec = getattr(params, kind)
        if spec is not None:
            return kind, spec
    return None


def check_json_schema(spec: str, field: str = "json_schema") -> dict[str, Any] | bool:
    """Parse a JSON schema string and check it against its metaschema (jsonschema).

    Returns the schema. Raises InvalidRequestError (param `field`, which the message
    names too) when `spec` is not JSON, not an object or boolean, or not a valid schema
    of its declared draft (default 2020-12).
    """
    import jsonschema

    def invalid(message: str) -> InvalidRequestError:
        return InvalidRequestError(f"{field} {message}", param=field, code="invalid_value")

    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as e:
        raise invalid(f"is not valid JSON: {e}") from None
    if not isinstance(schema, dict | bool):
        raise invalid("must be a JSON object (or a boolean)")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise invalid(f"is not a valid JSON schema at {path}: {e.message}") from None
    return schema


class GrammarCompiler:
    """Compiles grammar specs for one tokenizer with xgrammar, with an LRU cache.

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        vocab_size: width of the model's logits (may exceed the tokenizer's vocabulary;
            the extra ids are never allowed by a grammar).
        stop_token_ids: tokens that end a completed grammar (the model's EOS ids).
        max_entries: compiled grammars (and compile errors) kept.
        max_threads: xgrammar compiler threads.
        tokenizer_info: a ready `xgrammar.TokenizerInfo` to use instead of building one
            from `tokenizer` (tests use raw vocabularies).
        compile_timeout: seconds `validate` waits for a compile (None or 0: no limit;
            module doc).

    The xgrammar `TokenizerInfo` is built on the first
    compile, so a process that never sees a grammar never pays for it. Thread-safe:
    compiles of different specs run at once (xgrammar's compiler is thread-safe), a cache
    lookup never waits for one, and callers asking for a spec that is compiling share
    that compile's result.
    """

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        stop_token_ids: list[int],
        max_entries: int = 256,
        max_threads: int = 1,
        tokenizer_info=None,
        compile_timeout: float | None = None,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.max_entries = max_entries
        self.max_threads = max_threads
        self._info = tokenizer_info
        self.compile_timeout = compile_timeout or None
        self._compiler = None
        # (kind, spec) -> CompiledGrammar or the InvalidRequestError to raise for it.
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._inflight: dict[tuple[str, str], Future] = {}  # compiles under way
        self._lock = threading.Lock()  # guards the two dictionaries and _get_compiler
        self._timed = threading.BoundedSemaphore(TIMED_COMPILES)
        self._started: set[tuple[str, str]] = set()  # timed compiles holding a thread

    def compile(self, kind: str, spec: str):
        """The `xgrammar.CompiledGrammar` of `spec`, compiled on this thread unless cached
        or under way (then its result is awaited, without a time limit).

        kind: "json_schema" (a JSON schema as a string), "regex", "ebnf" (GBNF, root rule
        ``root``) or "structural_tag" (xgrammar's structural-tag JSON).
        Raises InvalidRequestError (param `kind`) when the spec is longer than
        `MAX_SPEC_CHARS`, invalid, not supported by xgrammar, or (code
        ``grammar_compile_timeout``) cached as too slow by `validate`.
        """
        return _unwrap(_result(self._future(kind, spec, None)))

    def submit(self, kind: str, spec: str, executor: ThreadPoolExecutor) -> Future:
        """A future of `spec`'s compile: done when cached, the compile under way when
        there is one, else a new compile on `executor` (so no worker ever waits for
        another's compile). Its value is a CompiledGrammar or an InvalidRequestError
        (`GrammarBackend.finish` raises it). Raises InvalidRequestError for a spec over
        `MAX_SPEC_CHARS`."""
        return self._future(kind, spec, executor.submit)

    def cached(self, kind: str, spec: str):
        """The compiled grammar of `spec` if it is in the cache (raises its cached
        InvalidRequestError), else None; never compiles."""
        with self._lock:
            hit = self._cache.get((kind, spec))
        return None if hit is None else _unwrap(hit)

    def validate(self, params: SamplingParams, wait: bool = True) -> None:
        """Compile the request's grammar, if any, waiting at most `compile_timeout`
        (module doc); with `wait` False only look it up (a cached refusal raises, a
        grammar not cached passes). Raises InvalidRequestError (see `compile`; code
        ``grammar_compile_timeout`` when its compile ran out of time), ServerError when
        it never got a compile thread (all `TIMED_COMPILES` busy with other specs).
        """
        spec = grammar_spec(params)
        if spec is None:
            return
        if not wait:
            self.cached(*spec)
        elif self.compile_timeout is None:
            self.compile(*spec)
        else:
            try:
                _unwrap(_result(self._future(*spec, self._start_timed), self.compile_timeout))
            except FutureTimeout:
                with self._lock:
                    started = spec in self._started
                raise (_too_slow(spec[0], self.compile_timeout) if started else _busy()) from None

    def _future(self, kind: str, spec: str, run) -> Future:
        """The future of `spec`'s compile (see `submit`); a new compile is started with
        ``run(self._run, key, future)`` (None: `_run` on this thread)."""
        if len(spec) > MAX_SPEC_CHARS:
            raise InvalidRequestError(
                f"the {kind} grammar is {len(spec)} characters; at most {MAX_SPEC_CHARS} "
                "are compiled",
                param=kind,
                code="invalid_value",
            )
        key = (kind, spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                done: Future = Future()
                done.set_result(hit)
                return done
            pending = self._inflight.get(key)
            if pending is not None:
                return pending
            pending = self._inflight[key] = Future()
        try:
            if run is None:
                self._run(key, pending)
            else:
                run(self._run, key, pending)
        except BaseException as e:  # could not start: nobody would ever settle it
            self._fail(key, pending, e)
            raise
        return pending

    def _start_timed(self, run, key: tuple[str, str], pending: Future) -> None:
        """Run `validate`'s compile of `key` on a daemon thread of its own (a timed-out
        wait leaves it running; a daemon does not hold up the process's exit)."""

        def body() -> None:
            # At most TIMED_COMPILES run at once; one that gets no turn within the
            # timeout is dropped, uncached, since its requests have been refused.
            if not self._timed.acquire(timeout=self.compile_timeout):
                self._fail(key, pending, _busy())
                return
            with self._lock:
                self._started.add(key)
            try:
                run(key, pending, late_after=self.compile_timeout)
            finally:
                with self._lock:
                    self._started.discard(key)
                self._timed.release()

        threading.Thread(target=body, name="grammar-compile", daemon=True).start()

    def _run(self, key: tuple[str, str], pending: Future, late_after: float | None = None):
        """Compile `key`, cache the result (as the ``grammar_compile_timeout`` refusal
        when it took over `late_after` seconds) and settle `pending` with it."""
        start = time.monotonic()
        try:
            hit = self._compile(*key)
        except BaseException as e:
            self._fail(key, pending, e)
            return
        if late_after is not None and time.monotonic() - start > late_after:
            hit = _too_slow(key[0], late_after)
        with self._lock:
            self._cache[key] = hit
            if len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
            del self._inflight[key]
        pending.set_result(hit)

    def _fail(self, key: tuple[str, str], pending: Future, error: BaseException) -> None:
        """Settle `pending` with `error`, uncached, and forget it as under way."""
        with self._lock:
            if self._inflight.get(key) is pending:
                del self._inflight[key]
        if not pending.done():  # set already when an interrupt came after the result
            pending.set_exception(error)

    def _compile(self, kind: str, spec: str):
        """Compile once; returns the grammar, or the InvalidRequestError to raise."""
        if kind not in GRAMMAR_FIELDS:
            raise ValueError(f"unknown grammar kind {kind!r}")
        try:
            ref = _outside_ref(kind, spec)
            if ref is not None:
                raise InvalidRequestError(
                    f"the {kind} grammar has $ref {ref!r}; only references inside a schema "
                    "('#' or '#/...') are followed, nothing is fetched",
                    param=kind,
                    code="invalid_value",
                )
            compiler = self._get_compiler()
            if kind == "json_schema":
                # One-line JSON (", " and ": " separators): weak models otherwise tend to
                # emit whitespace forever where any whitespace is allowed.
                return compiler.compile_json_schema(spec, any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(spec)
            if kind == "ebnf":
                return compiler.compile_grammar(spec)
            return compiler.compile_structural_tag(spec)
        except InvalidRequestError as e:
            return e
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar parse/convert errors
            message = _XGR_PREFIX.sub("", str(e).strip().splitlines()[0] if str(e) else "")
            return InvalidRequestError(
                f"invalid {kind}: {message or type(e).__name__}", param=kind, code="invalid_value"
            )

    def _get_compiler(self):
        with self._lock:  # built once, by the first compile
            if self._compiler is None:
                import xgrammar as xgr

                if self._info is None:
                    self._info = xgr.TokenizerInfo.from_huggingface(
                        self.tokenizer,
                        vocab_size=self.vocab_size,
                        stop_token_ids=self.stop_token_ids,
                    )
                # xgrammar's own cache (it reuses token masks across specs) is unbounded
                # by default.
                self._compiler = xgr.GrammarCompiler(
                    self._info, max_threads=self.max_threads, cache_limit_bytes=XGR_CACHE_BYTES
                )
            return self._compiler


class GrammarBackend:
    """The scheduler's grammar strategy: per-request matchers, logits masks, token accept.

    Args:
        compiler: compiles (and caches) the requests' grammars.
    """

    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler
        self._bitmask: torch.Tensor | None = None  # int32 [rows, ceil(vocab / 32)]
        self._pool: ThreadPoolExecutor | None = None  # compiles off the scheduler loop

    def prepare(self, req) -> None:
        """Give a constrained request its matcher (`req.grammar`); no-op without a grammar.

        Raises InvalidRequestError when the grammar does not compile.
        """
        spec = grammar_spec(req.params)
        if spec is not None:
            req.grammar = _matcher(self.compiler.compile(*spec))

    def start(self, req) -> Future | None:
        """Prepare `req` now when its grammar is cached (or it has none) and return None;
        else start compiling it on a worker thread and return the future, for `finish`
        once done. A large schema can take seconds to compile, which must not stall
        the running requests' steps.

        Raises InvalidRequestError for a grammar whose failure is cached.
        """
        spec = grammar_spec(req.params)
        if spec is None:
            return None
        compiled = self.compiler.cached(*spec)
        if compiled is not None:
            req.grammar = _matcher(compiled)
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(COMPILE_WORKERS, thread_name_prefix="grammar")
        return self.compiler.submit(*spec, self._pool)

    def finish(self, req, done: Future) -> None:
        """Give `req` the matcher of its compiled grammar (`done` from `start`, finished).
        Raises InvalidRequestError when it did not compile."""
        req.grammar = _matcher(_unwrap(done.result()))

    def apply(self, logits: torch.Tensor, reqs: list) -> None:
        """Set to -inf, in place, the logits of tokens each constrained request's grammar
        forbids next.

        Args:
            logits: float [B, vocab] (CPU or CUDA), row i belongs to reqs[i].
            reqs: the B requests about to sample.
        """
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return
        import xgrammar as xgr

        bitmask = self._rows(len(reqs))
        for i in rows:
            reqs[i].grammar.fill_next_token_bitmask(bitmask, i)
        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=self.compiler.vocab_size, indices=rows
        )

    def accept(self, req, token: int) -> bool:
        """Advance the request's matcher by its newly sampled `token`.

        Returns True when the grammar has terminated (it accepted a stop token after a
        complete match), so the request must finish with reason "stop"; False otherwise
        and for unconstrained requests. A token the grammar rejects (possible only when
        every allowed token had a -inf logit) also ends the request, with a warning.
        """
        matcher = req.grammar
        if matcher is None:
            return False
        if not matcher.accept_token(token):
            logger.warning("request %s: grammar rejected token %d; finishing", req.rid, token)
            return True
        if matcher.is_terminated():
            if req.matched_stop is None:
                req.matched_stop = token
            return True
        return False

    def _rows(self, n: int) -> torch.Tensor:
        """A bitmask buffer of at least `n` rows (each constrained row is fully rewritten by
        its matcher; the other rows are not read)."""
        import xgrammar as xgr

        if self._bitmask is None or self._bitmask.shape[0] < n:
            self._bitmask = xgr.allocate_token_bitmask(max(n, 8), self.compiler.vocab_size)
        return self._bitmask[:n]


def _matcher(compiled):
    """A fresh `xgrammar.GrammarMatcher` of one compiled grammar (one per request)."""
    import xgrammar as xgr

    return xgr.GrammarMatcher(compiled)


def _outside_ref(kind: str, spec: str) -> str | None:
    """The first reference in a JSON schema or structural tag that xgrammar cannot follow
    (schema_refs.py), or None. Raises InvalidRequestError for an invalid JSON schema."""
    if kind == "json_schema":
        return unresolvable_ref(check_json_schema(spec))
    if kind == "structural_tag":
        try:
            return structural_tag_ref(json.loads(spec))
        except json.JSONDecodeError:  # xgrammar names the error
            return None
    return None


def _unwrap(hit):
    """A cache value as the compiled grammar, or its InvalidRequestError raised."""
    if isinstance(hit, InvalidRequestError):
        raise hit.copy()
    return hit


def _result(pending: Future, timeout: float | None = None):
    """`pending`'s value; its InvalidRequestError raised as a copy (one exception object
    is shared by every caller that joined the compile). Raises FutureTimeout."""
    try:
        return pending.result(timeout)
    except InvalidRequestError as e:
        raise e.copy() from None


def _busy() -> ServerError:
    return ServerError(
        f"no grammar compile thread came free in time ({TIMED_COMPILES} other grammars "
        "are compiling); retry later"
    )


def _too_slow(kind: str, timeout: float) -> InvalidRequestError:
    return InvalidRequestError(
        f"the {kind} grammar did not compile within {timeout:g} s "
        "(--grammar-compile-timeout); simplify it",
        param=kind,
        code="grammar_compile_timeout",
    )
