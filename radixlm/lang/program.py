"""`@function` programs and how they run: `run` (one state) and `run_batch` (many).

A program is a Python function whose first parameter is the state `s`. `run` calls it on a
fresh `ProgramState`; gens run on the state's worker thread while the function goes on.
`run_batch` runs one program per argument dict on a thread pool, after caching the
program's constant prefix once (see `tracer`).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from radixlm.lang import ir, tracer
from radixlm.lang.backend.base import Backend
from radixlm.lang.executor import StreamExecutor
from radixlm.lang.state import ProgramState

logger = logging.getLogger(__name__)

_default_backend: Backend | None = None


def set_default_backend(backend: Any) -> None:
    """Backend for programs run without ``backend=`` (a Backend or a `radixlm.Engine`)."""
    global _default_backend
    _default_backend = as_backend(backend)


def get_default_backend() -> Backend | None:
    return _default_backend


def as_backend(backend: Any) -> Backend:
    """`backend` as a Backend: Backends as they are, an `Engine` wrapped (once), None the
    default. Raises ValueError when there is none, TypeError for anything else."""
    if backend is None:
        if _default_backend is None:
            raise ValueError(
                "no backend: call radixlm.set_default_backend(...) or pass backend=..."
            )
        return _default_backend
    if isinstance(backend, Backend):
        return backend
    from radixlm.runtime import Engine

    if isinstance(backend, Engine):
        from radixlm.lang.backend.engine import EngineBackend

        return EngineBackend.for_engine(backend)
    raise TypeError(f"not a backend: {type(backend).__name__}")


class Program:
    """A program made by `@function`. Call `run` / `run_batch` (calling it is `run`).

    Args:
        func: the program function; its first parameter is the state.
        num_api_spec_tokens: accepted for SGLang compatibility; unused.
        bind_arguments: arguments fixed by `bind`.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ):
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(f"program {func.__name__} must take the state as first parameter")
        self.arg_names = [p.name for p in params[1:]]
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: Any) -> Program:
        """A copy of this program with some arguments fixed."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown and not self._takes_kwargs():
            raise TypeError(f"{self.__name__} has no arguments {sorted(unknown)}")
        return Program(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def _takes_kwargs(self) -> bool:
        return any(
            p.kind == p.VAR_KEYWORD for p in inspect.signature(self.func).parameters.values()
        )

    def _arguments(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.__name__} takes {len(self.arg_names)} arguments")
        return {**self.bind_arguments, **dict(zip(self.arg_names, args)), **kwargs}

    def run(
        self,
        *args: Any,
        max_new_tokens: int = 128,
        min_new_tokens: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        priority: int = 0,
        stream: bool = False,
        backend: Any = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program once; keyword arguments other than the sampling options
        above (`ir.RUN_OPTIONS`, SGLang's defaults; every gen inherits them unless it
        sets its own) go to the program.

        With ``stream=True`` the program runs in the background and `text_iter` yields
        its text as it is generated. An exception raised by the program's own code
        propagates (with stream=True it is kept on `error()` instead).
        """
        defaults = _run_options(locals())
        arguments = self._arguments(args, kwargs)
        return _run_program(self.func, arguments, defaults, as_backend(backend), stream)

    __call__ = run

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        *,
        max_new_tokens: int = 128,
        min_new_tokens: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        priority: int = 0,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = True,
        generator_style: bool = False,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per argument dict, concurrently; returns the finished
        states in input order (a generator of them with `generator_style`). The sampling
        options are `run`'s, with the same defaults.

        Before the batch starts, the program's constant prefix (found by tracing it) is
        cached once. A program that raises keeps its exception on `error()`; the others
        are unaffected.

        Args:
            num_threads: programs running at once ("auto": up to max(96, 16 x CPUs)).
            progress_bar: show a tqdm bar of finished programs.
        Raises:
            TypeError: an item of `batch_kwargs` is not a dict.
        """
        defaults = _run_options(locals())
        backend = as_backend(backend)
        for item in batch_kwargs:
            if not isinstance(item, dict):
                raise TypeError(f"run_batch takes a list of dicts, got {type(item).__name__}")
        arguments = [self._arguments((), item) for item in batch_kwargs]
        if len(arguments) > 1:
            self.cache(backend)
        if num_threads == "auto":
            num_threads = max(96, (os.cpu_count() or 1) * 16)
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive int or 'auto': {num_threads!r}")
        num_threads = max(1, min(num_threads, len(arguments)))
        gen = _batch(self.func, arguments, defaults, backend, num_threads, progress_bar)
        return gen if generator_style else list(gen)

    def cache(self, backend: Any = None) -> int | None:
        """Cache the program's constant prefix on the backend; returns its prompt tokens
        (None when there is no prefix or the backend has no cache)."""
        backend = as_backend(backend)
        prefix = tracer.constant_prefix(self.func, self.bind_arguments, backend.chat_template)
        if not prefix:
            return None
        try:
            return backend.cache_prefix(prefix)
        except Exception as e:  # noqa: BLE001 - caching is an optimization
            logger.warning("could not cache the prefix of %s: %s", self.__name__, e)
            return None

    def trace_prefix(self, backend: Any = None) -> str:
        """The constant text the program writes before it depends on its arguments."""
        template = as_backend(backend).chat_template
        return tracer.constant_prefix(self.func, self.bind_arguments, template)


def _run_options(arguments: dict[str, Any]) -> ir.SamplingOptions:
    """The program's default options from the arguments of `run` / `run_batch` (their
    `locals()`), whose signatures hold the sampling options `ir.RUN_OPTIONS` and their
    defaults."""
    return ir.SamplingOptions(**{name: arguments[name] for name in ir.RUN_OPTIONS})


def _run_program(
    func: Callable[..., Any],
    arguments: dict[str, Any],
    defaults: ir.SamplingOptions,
    backend: Backend,
    stream: bool,
    keep_errors: bool = False,
) -> ProgramState:
    executor = StreamExecutor(backend, defaults, stream)
    state = ProgramState(executor)

    def body() -> None:
        try:
            state.ret_value = func(state, **arguments)
        except Exception as e:
            if not (keep_errors or stream):
                raise
            executor.set_error(e)
        finally:
            executor.end()

    if stream:
        threading.Thread(target=body, name="radixlm-program-body", daemon=True).start()
    else:
        body()
    return state


def _run_to_end(func, arguments, defaults, backend) -> ProgramState:
    state = _run_program(func, arguments, defaults, backend, stream=False, keep_errors=True)
    state.sync()
    for child in state.stream_executor.children:
        child.sync()
    return state


def _batch(func, arguments, defaults, backend, num_threads, progress_bar) -> Iterator[ProgramState]:
    if num_threads == 1:
        for args in _progress(arguments, progress_bar):
            yield _run_to_end(func, args, defaults, backend)
        return
    with ThreadPoolExecutor(num_threads, thread_name_prefix="radixlm-batch") as pool:
        futures = [pool.submit(_run_to_end, func, a, defaults, backend) for a in arguments]
        if progress_bar:
            for _ in _progress(as_completed(futures), True, total=len(futures)):
                pass
        for future in futures:
            yield future.result()


def _progress(items, enabled: bool, total: int | None = None):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, total=total)


def function(func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None):
    """Decorator making a program: ``@function`` or ``@function()``.

    The decorated function's first parameter is the program state `s`; the others are
    the program's arguments (given to `run` / `run_batch` as keywords).
    """
    if func is None:
        return lambda f: Program(f, num_api_spec_tokens)
    return Program(func, num_api_spec_tokens)
