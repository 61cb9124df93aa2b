"""The per-state interpreter: runs a program state's nodes in order on a worker thread.

`submit` only queues a node, so the program's Python code keeps running until it reads a
variable (`get_var` waits for the node that sets it) or the text (`sync`). Independent
states (programs of a batch, forks) have their own workers, so their requests reach the
backend concurrently and share its batches.

Invariants:
* only the worker thread mutates `text_`, `messages_`, `variables` and `meta_info`
  while nodes are pending; readers call `sync` (or wait on a variable's event) first;
* the worker thread exists only while nodes are pending (it is started on demand and
  exits when the queue is empty), so finished programs hold no threads;
* after a node fails, `error_` is set, every variable event is released and the
  remaining nodes are skipped: nothing waits forever on a failed program.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from radixlm.lang import ir
from radixlm.lang.backend.base import Backend, Prompt

logger = logging.getLogger(__name__)


class StreamExecutor:
    """Executes nodes for one program state against `backend`.

    Args:
        backend: where gens and selects are sent.
        defaults: the program's sampling options (`run(...)` keywords); gens override them.
        stream: gens stream their text (for `text_iter`) instead of arriving whole.
    """

    def __init__(self, backend: Backend, defaults: ir.SamplingOptions, stream: bool = False):
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.cur_role: str | None = None
        self.cur_role_begin_pos = 0
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.fork_start_text_pos = 0
        self.error_: BaseException | None = None
        self.children: list[StreamExecutor] = []
        self._scopes: dict[str, int] = {}
        self._events: dict[str, threading.Event] = {}
        self._writers: dict[str, int] = {}  # queued nodes that will set each variable
        self._pending: deque[ir.Expr] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._pieces: list[tuple[str | None, str]] = []
        self._rng = random.Random()
        self._handlers: dict[type, Callable[[Any], None]] = {
            ir.Constant: lambda e: self._append(e.text),
            ir.Concat: self._exec_concat,
            ir.Gen: self._exec_gen,
            ir.Select: self._exec_select,
            ir.RoleBegin: self._exec_role_begin,
            ir.RoleEnd: self._exec_role_end,
            ir.VarScopeBegin: self._exec_scope_begin,
            ir.VarScopeEnd: self._exec_scope_end,
            ir.CommitLazy: self._exec_commit,
            ir.ConcatAndAppend: self._exec_concat_and_append,
        }

    # ---- queue ------------------------------------------------------------------------

    def submit(self, expr: ir.Expr) -> None:
        """Queue `expr`; a worker thread runs it after the nodes queued before it."""
        with self._cond:
            for name in _declared_names(expr):
                if self._writers.get(name, 0) == 0:
                    self._events[name] = threading.Event()
                self._writers[name] = self._writers.get(name, 0) + 1
                if self.error_ is not None:
                    self._events[name].set()
            self._pending.append(expr)
            self._closed = False
            if not self._busy:
                self._busy = True
                threading.Thread(target=self._work, name="radixlm-program", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._busy = False
                    self._cond.notify_all()
                    return
                expr = self._pending.popleft()
            if self.error_ is not None:
                continue
            try:
                self._execute(expr)
            except Exception as e:  # noqa: BLE001 - surfaced by error() / get_var
                logger.debug("program node %s failed: %r", type(expr).__name__, e)
                self.set_error(e)

    def sync(self) -> None:
        """Wait until every queued node has run (or been skipped after an error)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._busy and not self._pending)

    def set_error(self, error: BaseException) -> None:
        """Fail the program: release every waiter; later nodes are skipped."""
        with self._cond:
            if self.error_ is None:
                self.error_ = error
            for event in self._events.values():
                event.set()
            self._cond.notify_all()

    def end(self) -> None:
        """The program's code has returned: streams end once the queue drains. Also ends
        the forks made by this state."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for child in self.children:
            child.end()

    def _finished(self) -> bool:
        return self.error_ is not None or (self._closed and not self._busy and not self._pending)

    # ---- reading ----------------------------------------------------------------------

    def get_var(self, name: str) -> Any:
        """Value of variable `name`, waiting for the node that sets it.

        Raises the program's error if it failed, KeyError for a name never set.
        """
        event = self._events.get(name)
        if event is not None:
            event.wait()
        else:
            self.sync()
        if self.error_ is not None:
            raise self.error_
        if name not in self.variables:
            raise KeyError(f"program has no variable {name!r}; set: {sorted(self.variables)}")
        return self.variables[name]

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        self.variables[name] = value

    def get_meta_info(self, name: str) -> Any:
        """Meta info of the gen/select that set `name` (waits for it; None if absent)."""
        self.get_var(name)
        return self.meta_info.get(name)

    def iter_pieces(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is produced (all of it, or only variable `var_name`'s), until the
        program ends (or that variable is complete). Raises the program's error."""
        index = 0

        def ready() -> bool:
            return index < len(self._pieces) or self._piece_done(var_name)

        while True:
            with self._cond:
                self._cond.wait_for(ready)
                batch = self._pieces[index:]
                index = len(self._pieces)
                done = self._piece_done(var_name)
            for var, delta in batch:
                if delta and (var_name is None or var == var_name):
                    yield delta
            if done and index == len(self._pieces):
                break
        if self.error_ is not None:
            raise self.error_

    def _piece_done(self, var_name: str | None) -> bool:
        if self._finished():
            return True
        event = self._events.get(var_name) if var_name is not None else None
        return event is not None and event.is_set()

    # ---- forks ------------------------------------------------------------------------

    def fork(self, size: int) -> list[StreamExecutor]:
        """`size` copies of this state after committing its text to the prefix cache.

        Raises the program's error if it failed before the fork.
        """
        if size < 1:
            raise ValueError(f"fork size must be >= 1, got {size}")
        self.submit(ir.CommitLazy())
        self.sync()
        if self.error_ is not None:
            raise self.error_
        forks = []
        for _ in range(size):
            child = StreamExecutor(self.backend, self.defaults, self.stream)
            child.text_ = self.text_
            child.messages_ = list(self.messages_)
            child.cur_role, child.cur_role_begin_pos = self.cur_role, self.cur_role_begin_pos
            child.variables = dict(self.variables)
            child.meta_info = dict(self.meta_info)
            child._scopes = dict(self._scopes)
            child.fork_start_text_pos = len(self.text_)
            forks.append(child)
        self.children.extend(forks)
        self.backend.expect_requests(size)  # the branches' first requests: batch them
        return forks

    # ---- node execution (worker thread) -----------------------------------------------

    def _execute(self, expr: ir.Expr) -> None:
        handler = self._handlers.get(type(expr))
        if handler is None:
            raise TypeError(f"cannot run program node {type(expr).__name__}")
        handler(expr)

    def _append(self, text: str, var: str | None = None) -> None:
        self.text_ += text
        if self.stream:
            self._add_piece(var, text)

    def _add_piece(self, var: str | None, text: str) -> None:
        with self._cond:
            self._pieces.append((var, text))
            self._cond.notify_all()

    def _set_var(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            self.meta_info[name] = meta
            self._writers[name] = max(self._writers.get(name, 0) - 1, 0)
            if self._writers[name] == 0:  # readers see the newest queued value
                self._events.setdefault(name, threading.Event()).set()
            self._cond.notify_all()

    def _exec_concat(self, expr: ir.Concat) -> None:
        for item in expr.items:
            self._execute(item)

    def _prompt(self) -> Prompt:
        role_text = self.text_[self.cur_role_begin_pos :] if self.cur_role else None
        return Prompt(self.text_, list(self.messages_), self.cur_role, role_text)

    def _exec_gen(self, expr: ir.Gen) -> None:
        options = expr.options.merged_over(self.defaults)
        streamed: list[str] = []
        on_delta = None
        if self.stream:

            def on_delta(delta: str) -> None:
                streamed.append(delta)
                self._add_piece(expr.name, delta)

        text, meta = self.backend.generate(self._prompt(), options, on_delta)
        sent = "".join(streamed)
        if self.stream and text.startswith(sent) and len(text) > len(sent):
            self._add_piece(expr.name, text[len(sent) :])  # the part not streamed
        self.text_ += text
        self._set_var(expr.name, text, meta)

    def _exec_select(self, expr: ir.Select) -> None:
        decision = self.backend.select(
            self.text_, expr.choices, expr.temperature, expr.method, self._rng
        )
        self._append(decision.decision, expr.name)
        self._set_var(expr.name, decision.decision, decision.meta_info)

    def _exec_role_begin(self, expr: ir.RoleBegin) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {expr.role!r} opened inside role {self.cur_role!r}")
        template = self.backend.chat_template
        if not self.text_ and template.preamble:
            self._append(template.preamble)
        self._append(template.get_prefix_and_suffix(expr.role)[0])
        self.cur_role, self.cur_role_begin_pos = expr.role, len(self.text_)

    def _exec_role_end(self, expr: ir.RoleEnd) -> None:
        if self.cur_role != expr.role:
            raise ValueError(f"role {expr.role!r} closed while {self.cur_role!r} is open")
        content = self.text_[self.cur_role_begin_pos :]
        self.messages_.append({"role": expr.role, "content": content})
        self._append(self.backend.chat_template.get_prefix_and_suffix(expr.role)[1])
        self.cur_role = None

    def _exec_scope_begin(self, expr: ir.VarScopeBegin) -> None:
        self._scopes[expr.name] = len(self.text_)

    def _exec_scope_end(self, expr: ir.VarScopeEnd) -> None:
        if expr.name not in self._scopes:
            raise ValueError(f"var_scope {expr.name!r} ended without beginning")
        self._set_var(expr.name, self.text_[self._scopes.pop(expr.name) :], None)

    def _exec_commit(self, expr: ir.CommitLazy) -> None:
        if self.text_:
            self.backend.cache_prefix(self.text_)

    def _exec_concat_and_append(self, expr: ir.ConcatAndAppend) -> None:
        parts = []
        for child in expr.states:
            child.sync()
            if child.error_ is not None:
                raise child.error_
            parts.append(child.text_[child.fork_start_text_pos :])
        self._append("".join(parts))


def _declared_names(expr: ir.Expr) -> Iterator[str]:
    """Variable names `expr` will set (so readers wait for the newest value)."""
    if isinstance(expr, ir.Concat):
        for item in expr.items:
            yield from _declared_names(item)
    elif isinstance(expr, (ir.Gen, ir.Select)) and expr.name is not None:
        yield expr.name
    elif isinstance(expr, ir.VarScopeEnd):
        yield expr.name
