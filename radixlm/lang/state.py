"""`ProgramState` (the `s` a program receives) and `ProgramStateGroup` (what `fork` returns).

``s += node`` queues work and returns at once; reading (``s["x"]``, ``s.text()``) waits
for it. See `executor.StreamExecutor` for the execution model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixlm.lang import ir
from radixlm.lang.executor import StreamExecutor


class ProgramState(ir.RoleMethods):
    """The state of one running program: its text, chat messages and variables.

    Errors raised while running the program's nodes (a refused request, a backend that
    cannot run a primitive) are kept: `error()` returns them and reading a variable or
    the text raises them.
    """

    def __init__(self, executor: StreamExecutor):
        self.stream_executor = executor
        self.ret_value: Any = None

    # ---- building ---------------------------------------------------------------------

    def __iadd__(self, other: Any) -> ProgramState:
        self.stream_executor.submit(ir.to_expr(other))
        return self

    def _emit(self, expr: ir.Expr) -> None:
        self.stream_executor.submit(expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block is also stored as variable `name`."""
        self.stream_executor.submit(ir.VarScopeBegin(name))
        yield
        self.stream_executor.submit(ir.VarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ProgramStateGroup:
        """`size` independent copies of this state.

        The text so far is first committed to the backend's prefix cache, so the copies'
        requests reuse it. Raises the program's error if it already failed.
        """
        children = self.stream_executor.fork(size)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    def copy(self) -> ProgramState:
        """One fork of this state."""
        return self.fork(1)[0]

    # ---- reading ----------------------------------------------------------------------

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.stream_executor.variables

    def get_meta_info(self, name: str) -> Any:
        """Server meta info of the gen/select that set `name` (finish_reason, token
        counts, cached_tokens, logprobs when asked; for select the choice scores)."""
        return self.stream_executor.get_meta_info(name)

    def sync(self) -> None:
        """Wait until everything appended so far has run."""
        self.stream_executor.sync()

    def _raise(self) -> None:
        if self.stream_executor.error_ is not None:
            raise self.stream_executor.error_

    def text(self) -> str:
        """The whole text so far (waits). Raises the program's error."""
        self.sync()
        self._raise()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, str]]:
        """Finished chat messages as ``{"role", "content"}`` dicts (waits)."""
        self.sync()
        self._raise()
        return list(self.stream_executor.messages_)

    def error(self) -> BaseException | None:
        """The exception that stopped the program, or None (waits for pending work)."""
        self.sync()
        return self.stream_executor.error_

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is produced: all of it, or only variable `var_name`'s.

        For a program run with ``stream=True`` this yields pieces while gens run;
        otherwise it yields the finished text (or variable) once.
        """
        ex = self.stream_executor
        if not ex.stream:
            yield self.text() if var_name is None else str(self.get_var(var_name))
            return
        yield from ex.iter_pieces(var_name)

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio code (the waiting runs in the default executor).
        With `return_meta_data`, yields (piece, meta_info of `var_name`) pairs."""
        loop = asyncio.get_running_loop()
        pieces = self.text_iter(var_name)
        end = object()
        while True:
            piece = await loop.run_in_executor(None, next, pieces, end)
            if piece is end:
                return
            if return_meta_data:
                yield piece, self.stream_executor.meta_info.get(var_name)
            else:
                yield piece

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The states made by `fork`. ``group += x`` appends to every state: `x` itself, its
    i-th item for a list, or ``x(i)`` for a function of the index."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState):
        self.states = states
        self.src_state = src_state

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if value is not self.states[i]:
            raise TypeError("forks can only be extended in place (forks[i] += ...)")

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} items for {len(self.states)} forks")
            for state, item in zip(self.states, other):
                state += item
        elif callable(other):
            fn: Callable[[int], Any] = other
            for i, state in enumerate(self.states):
                state += fn(i)
        else:
            for state in self.states:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Bring the forks' results back into the source state.

        ``gather_variable``: each variable the forks set (and the source lacks) becomes a
        list of the forks' values in the source state. ``concate_and_append``: the text
        each fork added is appended to the source state, fork by fork.
        Raises a fork's error; ValueError for another mode.
        """
        src = self.src_state.stream_executor
        if mode == "gather_variable":
            src.sync()
            known = set(src.variables)
            gathered: dict[str, list[Any]] = {}
            for state in self.states:
                ex = state.stream_executor
                ex.sync()
                if ex.error_ is not None:
                    raise ex.error_
                for name in ex.variables.keys() - known:
                    gathered.setdefault(name, []).append(ex.variables[name])
            for name, values in gathered.items():
                src.set_var(name, values)
        elif mode == "concate_and_append":
            self.src_state += ir.ConcatAndAppend([s.stream_executor for s in self.states])
            src.sync()
        else:
            raise ValueError(
                f"join mode must be 'gather_variable' or 'concate_and_append': {mode!r}"
            )
