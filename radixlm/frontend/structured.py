"""OpenAI ``response_format`` (and the ``regex`` / ``ebnf`` extensions) -> a grammar
field of SamplingParams (runtime/sampling/grammar.py).

* ``{"type": "text"}`` (or unset): no constraint.
* ``{"type": "json_object"}``: any JSON object (``json_schema = '{"type": "object"}'``,
  as SGLang does).
* ``{"type": "json_schema", "json_schema": {"name", "schema", "description", "strict"}}``:
  the output matches ``schema`` (a missing schema means any JSON object). The schema is
  checked against its metaschema (jsonschema) and compiled (xgrammar) here, so an invalid
  one is a 400 before anything is queued.
* The SGLang extensions ``regex`` and ``ebnf`` (completions and chat) pass through.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixlm.errors import InvalidRequestError
from radixlm.frontend.errors import invalid_request, renamed
from radixlm.runtime.sampling.grammar import GrammarCompiler
from radixlm.runtime.sampling.sampler import SamplingParams

ANY_JSON_OBJECT = json.dumps({"type": "object"})
_NAME = re.compile(r"^[a-zA-Z0-9_\-]{1,64}$")


class JsonSchemaFormat(BaseModel):
    """The ``json_schema`` member of ``response_format`` (OpenAI's fields)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


def request_grammar(req, compiler: GrammarCompiler) -> dict[str, str]:
    """Grammar fields of a completions / chat request: from ``response_format`` or the
    ``regex`` / ``ebnf`` extensions, at most one of them. Raises APIError (400)."""
    fields = response_format_grammar(getattr(req, "response_format", None), compiler)
    for name in ("regex", "ebnf"):
        value = getattr(req, name, None)
        if value is None:
            continue
        if fields:
            given = "response_format" if "json_schema" in fields else next(iter(fields))
            raise invalid_request(f"'{name}' cannot be combined with '{given}'", param=name)
        fields = {name: value}
        check_grammar(fields, compiler, name)
    return fields


def response_format_grammar(response_format, compiler: GrammarCompiler) -> dict[str, str]:
    """SamplingParams grammar fields for a request's ``response_format`` (a
    `protocol.ResponseFormat` or None): ``{}`` or ``{"json_schema": ...}``.

    Raises APIError (400, param ``response_format``) for a missing or malformed
    ``json_schema`` member, an invalid schema, or one xgrammar cannot compile.
    """
    if response_format is None or response_format.type == "text":
        return {}
    if response_format.type == "json_object":
        return {"json_schema": ANY_JSON_OBJECT}
    if response_format.json_schema is None:
        raise invalid_request(
            "response_format of type 'json_schema' needs a 'json_schema' member",
            param="response_format.json_schema",
        )
    try:
        fmt = JsonSchemaFormat.model_validate(response_format.json_schema)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        raise invalid_request(
            f"invalid response_format.json_schema.{where}: {err['msg']}",
            param="response_format.json_schema",
        ) from None
    if not _NAME.match(fmt.name):
        raise invalid_request(
            "response_format.json_schema.name must be 1-64 letters, digits, '_' or '-'",
            param="response_format.json_schema.name",
        )
    spec = ANY_JSON_OBJECT if fmt.schema_ is None else json.dumps(fmt.schema_)
    fields = {"json_schema": spec}
    check_grammar(fields, compiler, "response_format.json_schema.schema")
    return fields


def check_grammar(fields: dict[str, str], compiler: GrammarCompiler, param: str) -> None:
    """Compile the grammar of `fields` (cached); raise APIError (400, `param`) if invalid."""
    try:
        compiler.validate(SamplingParams(**fields))
    except InvalidRequestError as e:
        raise renamed(e, {}, default=param) from None
