"""Find a program's constant prefix: the text it writes before anything depends on its
arguments or on the model.

The program runs once on a `TraceState` with a `Placeholder` for every argument. Text and
role markers are recorded; the first gen, select, fork, variable read, or use of an
argument (formatting it, adding it to text, testing it) stops the trace. `run_batch`
caches the recorded prefix once before starting its programs, so a batch sharing a
few-shot prefix computes it once instead of once per concurrently admitted request.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

from radixlm.lang import ir
from radixlm.lang.chat_template import ChatTemplate

logger = logging.getLogger(__name__)


class TraceStop(Exception):
    """The traced program reached something that is not constant."""


class Placeholder:
    """Stands for an argument whose value is unknown while tracing: any use stops it."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _stop(self, *args: Any, **kwargs: Any):
        raise TraceStop(object.__getattribute__(self, "_name"))

    __str__ = __repr__ = __format__ = __bool__ = __len__ = __iter__ = _stop
    __add__ = __radd__ = __mul__ = __rmul__ = __mod__ = __rmod__ = _stop
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _stop
    __getitem__ = __contains__ = __call__ = __int__ = __float__ = __index__ = _stop

    def __getattr__(self, name: str):
        raise TraceStop(name)


class TraceState(ir.RoleMethods):
    """Records constant text; any other use of the state stops the trace."""

    def __init__(self, template: ChatTemplate):
        self.template = template
        self.text_ = ""

    def __iadd__(self, other: Any) -> TraceState:
        self._add(ir.to_expr(other))
        return self

    def _add(self, expr: ir.Expr) -> None:
        if isinstance(expr, ir.Constant):
            self.text_ += expr.text
        elif isinstance(expr, ir.Concat):
            for item in expr.items:
                self._add(item)
        elif isinstance(expr, ir.RoleBegin):
            if not self.text_:
                self.text_ += self.template.preamble
            self.text_ += self.template.get_prefix_and_suffix(expr.role)[0]
        elif isinstance(expr, ir.RoleEnd):
            self.text_ += self.template.get_prefix_and_suffix(expr.role)[1]
        elif isinstance(expr, (ir.VarScopeBegin, ir.VarScopeEnd)):
            pass
        else:
            raise TraceStop(type(expr).__name__)

    _emit = _add

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        yield

    def __getitem__(self, name: str):
        raise TraceStop(name)

    def __getattr__(self, name: str):
        raise TraceStop(name)


def constant_prefix(func: Callable[..., Any], bound: dict[str, Any], template: ChatTemplate) -> str:
    """The text `func(s, ...)` writes before depending on an unbound argument or the model.

    Args:
        func: the program function (first parameter: the state).
        bound: arguments with known values (`Program.bind`); the others are placeholders.
        template: role markers, as the backend will write them.
    """
    params = list(inspect.signature(func).parameters.values())[1:]
    kwargs = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kwargs[p.name] = bound[p.name] if p.name in bound else Placeholder(p.name)
    state = TraceState(template)
    try:
        func(state, **kwargs)
    except TraceStop:
        pass
    except Exception as e:  # noqa: BLE001 - a trace is an optimization; keep what it found
        logger.debug("tracing %s stopped on %r", getattr(func, "__name__", func), e)
    return state.text_
