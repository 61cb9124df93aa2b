"""Program expressions: the nodes a program appends to its state (`s += node`).

Nodes are inert descriptions; `executor.StreamExecutor` runs them in order. Text and
nodes concatenate with ``+`` (``"Q: " + gen("a")`` is a `Concat`), as in SGLang.

`SamplingOptions` holds generation settings with SGLang's names; `None` means "inherit"
(a gen's options are merged over the program's `run(...)` defaults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# dtype -> regex for `gen(dtype=...)` (constrained decoding). Whitespace after numbers lets
# the model end the value the way it would write it in prose.
INT_REGEX = r"[-+]?[0-9]+[ \n]*"
FLOAT_REGEX = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
BOOL_REGEX = r"(True|False)"
STR_REGEX = r"\"[\w\d\s]*\""
DTYPE_REGEX: dict[str, str] = {
    "int": INT_REGEX,
    "float": FLOAT_REGEX,
    "bool": BOOL_REGEX,
    "str": STR_REGEX,
}


def dtype_regex(dtype: Any) -> str:
    """The regex for a gen dtype (`int`, `float`, `bool`, `str` or their names).

    Raises ValueError for any other dtype.
    """
    name = dtype.__name__ if isinstance(dtype, type) else dtype
    if name not in DTYPE_REGEX:
        raise ValueError(f"gen dtype must be one of int, float, bool, str; got {dtype!r}")
    return DTYPE_REGEX[name]


# Values equal to the server's own defaults are not sent, so a server that lacks an
# optional feature (penalties, min tokens) still serves programs that do not use it.
_NEUTRAL: dict[str, Any] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "min_new_tokens": 0,
}


@dataclass(frozen=True)
class SamplingOptions:
    """Generation settings of one gen (SGLang names; `None` = inherit from the program).

    max_new_tokens: tokens to generate at most. stop: strings that end generation (not
    included in the result). priority: the request's scheduling priority (higher =
    admitted first, retracted last; docs/slo.md); not a sampling parameter, it travels
    as the request's own field. regex / json_schema (a JSON schema string) / ebnf: constrain
    the output; dtype (int, float, bool, str) is a shorthand for a regex.
    """

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    priority: int | None = None
    dtype: Any = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None

    def merged_over(self, base: SamplingOptions) -> SamplingOptions:
        """These options with every unset (None) field taken from `base`."""
        changes = {
            f.name: getattr(base, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is None
        }
        return dataclasses.replace(self, **changes)

    def constraint(self) -> dict[str, str]:
        """The constrained-decoding field to send ({} when unconstrained).

        Raises ValueError when more than one of regex / json_schema / ebnf / dtype is set.
        """
        given = {
            k: v
            for k, v in (
                ("regex", self.regex),
                ("json_schema", self.json_schema),
                ("ebnf", self.ebnf),
            )
            if v is not None
        }
        if self.dtype is not None:
            if given:
                raise ValueError("gen: dtype cannot be combined with regex, json_schema or ebnf")
            return {"regex": dtype_regex(self.dtype)}
        if len(given) > 1:
            raise ValueError(
                f"gen: give at most one of regex, json_schema, ebnf; got {sorted(given)}"
            )
        return given

    def to_sampling_params(self) -> dict[str, Any]:
        """The `sampling_params` dict of a native /generate request (SGLang names).

        Fields equal to the server's defaults are left out; `stop` becomes a list.
        """
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
        }
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and value != neutral:
                out[name] = value
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if stop:
            out["stop"] = stop
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        out.update(self.constraint())
        return {k: v for k, v in out.items() if v is not None}

    def logprob_args(self) -> dict[str, Any] | None:
        """Top-level logprob fields of a /generate request, or None when not requested."""
        if not self.return_logprob:
            return None
        args: dict[str, Any] = {"return_logprob": True}
        if self.logprob_start_len is not None:
            args["logprob_start_len"] = self.logprob_start_len
        if self.top_logprobs_num:
            args["top_logprobs_num"] = self.top_logprobs_num
        if self.return_text_in_logprobs:
            args["return_text_in_logprobs"] = True
        return args


# Options only a gen sets: how its output is constrained.
CONSTRAINT_OPTIONS = ("dtype", "regex", "json_schema", "ebnf")

# Options a program's `run(...)` / `run_batch(...)` sets for every gen: all the others.
RUN_OPTIONS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(SamplingOptions) if f.name not in CONSTRAINT_OPTIONS
)


def json_schema_text(schema: str | dict | None) -> str | None:
    """A JSON schema as the string the server expects (dicts are serialized)."""
    if schema is None or isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    raise TypeError(f"json_schema must be a str or dict, got {type(schema).__name__}")


# ---- nodes ----------------------------------------------------------------------------


class Expr:
    """Base of every program node; ``+`` builds a `Concat` with text or other nodes."""

    def __add__(self, other: Any) -> Concat:
        return Concat([self, to_expr(other)])

    def __radd__(self, other: Any) -> Concat:
        return Concat([to_expr(other), self])


@dataclass(eq=False)
class Constant(Expr):
    """Literal text appended to the state."""

    text: str


@dataclass(eq=False)
class Concat(Expr):
    """Several nodes in order; nested concatenations are flattened."""

    items: list[Expr]

    def __post_init__(self) -> None:
        flat: list[Expr] = []
        for item in self.items:
            flat.extend(item.items if isinstance(item, Concat) else [item])
        self.items = flat


@dataclass(eq=False)
class Gen(Expr):
    """Generate text into variable `name` (None: append only) with `options`."""

    name: str | None
    options: SamplingOptions = field(default_factory=SamplingOptions)


@dataclass(eq=False)
class Select(Expr):
    """Append the choice the model scores highest and store it in `name`.

    method: a `choices.ChoicesSamplingMethod`; temperature 0 picks the best score,
    above 0 samples choices in proportion to exp(score / temperature).
    """

    name: str | None
    choices: list[str]
    temperature: float
    method: Any


@dataclass(eq=False)
class RoleBegin(Expr):
    """Open a chat role: appends the role's begin marker from the chat template."""

    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    """Close a chat role: records the message and appends the role's end marker."""

    role: str


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    """Stores the text appended since the matching VarScopeBegin in variable `name`."""

    name: str


@dataclass(eq=False)
class CommitLazy(Expr):
    """Send the text so far to the backend's prefix cache (a max_new_tokens=0 request)."""


@dataclass(eq=False)
class ConcatAndAppend(Expr):
    """Append the text each forked state added after its fork point (join mode
    ``concate_and_append``). `states`: the forks' executors."""

    states: Sequence[Any]


ROLES = ("system", "user", "assistant")


def to_expr(value: Any) -> Expr:
    """A node for `value`: nodes as they are, anything else as its `str` text.

    Raises ValueError for None (a likely bug: a function that forgot to return).
    """
    if isinstance(value, Expr):
        return value
    if value is None:
        raise ValueError("cannot append None to a program state")
    return Constant(value if isinstance(value, str) else str(value))


def role_expr(role: str, expr: Any = None) -> Expr:
    """``role``'s begin marker, `expr` (nothing when None), then its end marker."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    if expr is None:
        return Concat([RoleBegin(role), RoleEnd(role)])
    return Concat([RoleBegin(role), to_expr(expr), RoleEnd(role)])


class RoleMethods:
    """``s.system/user/assistant``: with an argument, append that role's message; without,
    a ``with`` block that opens and closes the role. Shared by `ProgramState` and the
    tracer's `TraceState`; a subclass defines `_emit` (take one node)."""

    def _emit(self, expr: Expr) -> None:
        raise NotImplementedError

    def _role(self, role: str, expr: Any) -> Any:
        if expr is not None:
            self._emit(role_expr(role, expr))
            return None
        return self._role_block(role)

    @contextlib.contextmanager
    def _role_block(self, role: str) -> Iterator[None]:
        self._emit(RoleBegin(role))
        yield
        self._emit(RoleEnd(role))

    def system(self, expr: Any = None):
        """``s.system("...")`` appends a system message; ``with s.system():`` opens one."""
        return self._role("system", expr)

    def user(self, expr: Any = None):
        """``s.user("...")`` appends a user message; ``with s.user():`` opens one."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None):
        """``s.assistant(gen("a"))`` appends an assistant turn; ``with s.assistant():``."""
        return self._role("assistant", expr)
