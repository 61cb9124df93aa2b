"""The primitives programs are written with (SGLang's names and arguments)."""

from __future__ import annotations

import dataclasses
from typing import Any

from radixlm.lang import ir
from radixlm.lang.backend.base import check_choices
from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.program import as_backend


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    priority: int | None = None,
    dtype: Any = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: str | dict | None = None,
    ebnf: str | None = None,
) -> ir.Expr:
    """Generate text and store it in variable `name`.

    Unset options inherit the program's `run(...)` defaults. `max_tokens` is the most
    new tokens; `stop` strings end the text (and are not included). `regex`,
    `json_schema` (a JSON schema, str or dict) or `ebnf` constrain the output; `dtype`
    (int, float, bool, str) constrains it to a literal of that type by a regex (the
    variable still holds the text). With `choices`, this is `select` (temperature
    defaults to 0). `priority`: this gen's scheduling priority (higher first).

    Raises:
        ValueError: n > 1 (use `s.fork(n)`), an unknown dtype, conflicting constraints,
            or empty choices.
    """
    if n not in (None, 1):
        raise ValueError("gen(n > 1) is not supported; fork the state: s.fork(n)")
    if choices is not None:
        return select(
            name,
            choices,
            0.0 if temperature is None else temperature,
            choices_method or token_length_normalized,
        )
    options = _gen_options(locals())
    options.constraint()  # fail at the call site on a bad dtype or conflicting constraints
    return ir.Gen(name, options)


# gen's arguments whose SGLang names differ from their `ir.SamplingOptions` field.
_GEN_ARGUMENT = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def _gen_options(arguments: dict[str, Any]) -> ir.SamplingOptions:
    """The options of a gen from its arguments (`gen`'s `locals()`): each field from the
    argument of its name (or `_GEN_ARGUMENT`'s), a dict json_schema serialized."""
    values = {
        f.name: arguments[_GEN_ARGUMENT.get(f.name, f.name)]
        for f in dataclasses.fields(ir.SamplingOptions)
    }
    values["json_schema"] = ir.json_schema_text(values["json_schema"])
    return ir.SamplingOptions(**values)


def gen_int(name: str | None = None, **kwargs: Any) -> ir.Expr:
    """`gen` constrained to an integer literal (dtype=int)."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> ir.Expr:
    """`gen` constrained to a double-quoted string literal (dtype=str)."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> ir.Expr:
    """Append the choice the model prefers and store it in variable `name`.

    All choices are scored in one batched request as continuations of the text so far
    (see `radixlm.lang.choices` for the methods). temperature 0 takes the best score;
    above 0 it samples with probability ∝ exp(score / temperature).

    Raises ValueError for missing, empty or non-string choices or a negative temperature.
    """
    if temperature < 0:
        raise ValueError(f"select temperature must be >= 0, got {temperature}")
    return ir.Select(name, check_choices(choices), float(temperature), choices_method)


def system(expr: Any = None) -> ir.Expr:
    """A system message around `expr` (begin and end markers from the chat template)."""
    return ir.role_expr("system", expr)


def user(expr: Any = None) -> ir.Expr:
    """A user message around `expr`."""
    return ir.role_expr("user", expr)


def assistant(expr: Any = None) -> ir.Expr:
    """An assistant message around `expr` (typically a `gen`)."""
    return ir.role_expr("assistant", expr)


def system_begin() -> ir.Expr:
    return ir.RoleBegin("system")


def system_end() -> ir.Expr:
    return ir.RoleEnd("system")


def user_begin() -> ir.Expr:
    return ir.RoleBegin("user")


def user_end() -> ir.Expr:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.Expr:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.Expr:
    return ir.RoleEnd("assistant")


def flush_cache(backend: Any = None) -> bool:
    """Drop the backend's prefix cache (default backend when None); False if refused."""
    return as_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """The backend server's settings and counters (`/get_server_info`)."""
    return as_backend(backend).get_server_info()
