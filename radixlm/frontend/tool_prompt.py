"""Chat requests with tools: validation, prompt rendering, and the forcing grammar.

* `ToolSetup.from_request` checks ``tools`` (OpenAI function tools) and ``tool_choice``
  (``auto`` | ``none`` | ``required`` | ``{"type": "function", "function": {"name"}}``);
  every bad value is a 400 naming the field. Unknown fields in a tool definition are
  dropped with a logged warning, or (``--strict-request-fields``) a 400
  ``unknown_parameter`` naming the first (``tools.0.function.foo``).
* `render_chat` builds the chat-template input. A template that knows tools (its source
  mentions ``tools``) gets ``tools=`` plus assistant ``tool_calls`` (arguments as dicts)
  and ``tool`` messages as they are. Otherwise (SmolLM2's ChatML template renders
  neither) the tool list and the Hermes calling convention (`tool_parsers/hermes.py`) go
  into the system message, earlier calls are written into the assistant text in it,
  and tool results become ``<tool_response>`` user turns.
* ``required`` / named choices are enforced with an xgrammar structural tag: the output
  is one call (several when ``parallel_tool_calls`` is true), written in the convention
  of the request's tool-call parser (Hermes ``<tool_call>``, Llama 3 JSON, Mistral,
  DeepSeek or Pythonic; `ToolParser.forced_format`), whose name is one of the allowed
  tools and whose arguments match that tool's parameter schema. With ``auto`` the text
  is free, but a Hermes call, once started, is constrained the same way.
  ``none`` renders no tools and parses nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixlm.errors import InvalidRequestError
from radixlm.frontend.errors import invalid_request, renamed
from radixlm.frontend.protocol import unknown_fields
from radixlm.frontend.tool_parsers.base import ToolParser
from radixlm.frontend.tool_parsers.hermes import CALL_END, CALL_START, HermesParser, hermes_tag
from radixlm.runtime.sampling.grammar import check_json_schema

logger = logging.getLogger(__name__)

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_HERMES = HermesParser()

_SYSTEM_TOOLS = """# Tools

You can call functions to help answer the user. The available functions, one JSON \
signature per line, are listed between <tools> and </tools>:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object holding its name and its arguments between \
<tool_call> and </tool_call> tags, like this:
<tool_call>
{{"name": "function_name", "arguments": {{"argument": "value"}}}}
</tool_call>
Function results come back between <tool_response> and </tool_response> tags."""


class _Strict(BaseModel):
    """Strictly typed; unknown fields are kept in `model_extra` (see `_check_tool`)."""

    model_config = ConfigDict(extra="allow", strict=True)


class FunctionDef(_Strict):
    """An OpenAI function definition."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(_Strict):
    type: str
    function: FunctionDef


class ToolSetup:
    """The tools of one chat request and how to treat them.

    Attributes:
        tools: the validated tools (OpenAI dicts), empty when none are rendered.
        forced: names a forcing grammar allows (all tools for ``required``, one for a
            named choice), or None (``auto``: the model chooses whether to call).
        parallel: several calls allowed in a forced answer.
    """

    def __init__(self, tools: list[dict[str, Any]], forced: list[str] | None, parallel: bool):
        self.tools = tools
        self.forced = forced
        self.parallel = parallel

    @property
    def active(self) -> bool:
        """Tools are rendered and the output is parsed for calls."""
        return bool(self.tools)

    @classmethod
    def from_request(
        cls,
        tools: list[dict] | None,
        choice: str | dict | None,
        parallel: bool | None,
        strict: bool = False,
    ) -> ToolSetup:
        """Validate ``tools`` / ``tool_choice``. Raises APIError (400); `strict`
        (``--strict-request-fields``): an unknown field in a tool is a 400 too."""
        if not tools:
            if tools is not None and choice not in (None, "none", "auto"):
                raise invalid_request("'tool_choice' needs a non-empty 'tools'", "tool_choice")
            if tools is None and choice not in (None, "none", "auto"):
                raise invalid_request(
                    "'tool_choice' is only allowed when 'tools' are specified", "tool_choice"
                )
            return cls([], None, False)
        checked, unknown = [], []
        for i, tool in enumerate(tools):
            known, extra = _check_tool(i, tool)
            checked.append(known)
            unknown += extra
        if unknown and strict:
            raise invalid_request(
                f"Unrecognized request argument supplied: {unknown[0]}",
                param=unknown[0],
                code="unknown_parameter",
            )
        if unknown:
            logger.warning("ignoring request fields: %s", ", ".join(unknown))
        names = [t["function"]["name"] for t in checked]
        if len(set(names)) != len(names):
            raise invalid_request("tool function names must be unique", "tools")
        forced = _forced_names(choice, names)
        if choice == "none":
            return cls([], None, False)
        return cls(checked, forced, bool(parallel))

    def grammar(self, parser: ToolParser = _HERMES) -> str | None:
        """The structural tag (JSON) for this request's calls, or None.

        Forced choices: the output is the call(s) of allowed tools in `parser`'s own
        convention (`ToolParser.forced_format`) and nothing else, so `parser` reads it.
        ``auto`` (Hermes only; None for another parser): free text, but once the model
        writes ``<tool_call>`` the call must name a tool and match its parameters
        (xgrammar triggered tags), so every call parses. Either way a call's arguments
        match the tool's ``parameters`` schema, and only one call is allowed unless
        `parallel`.
        """
        if not self.tools:
            return None
        by_name = {t["function"]["name"]: t["function"] for t in self.tools}
        names = self.forced if self.forced is not None else list(by_name)
        allowed = [(name, by_name[name].get("parameters") or _ANY_OBJECT) for name in names]
        if self.forced is not None:
            fmt = parser.forced_format(allowed, self.parallel)
        elif parser.name == "hermes":
            fmt = {
                "type": "triggered_tags",
                "triggers": [CALL_START],
                "tags": [hermes_tag(name, schema) for name, schema in allowed],
                "stop_after_first": not self.parallel,
            }
        else:
            return None
        return json.dumps({"type": "structural_tag", "format": fmt})


def _check_tool(index: int, tool: Any) -> tuple[dict[str, Any], list[str]]:
    """(the tool in OpenAI shape with only its known fields, the dotted paths of its
    unknown fields). Raises APIError (400) for a malformed tool."""
    param = f"tools.{index}"
    try:
        parsed = FunctionTool.model_validate(tool)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        raise invalid_request(
            f"invalid tool at {param}.{where}: {err['msg']}", param=param
        ) from None
    if parsed.type != "function":
        raise invalid_request(
            f"tool type {parsed.type!r} is not supported (only 'function')", param=f"{param}.type"
        )
    params = parsed.function.parameters
    if params is not None:
        try:
            check_json_schema(json.dumps(params), field="parameters")
        except InvalidRequestError as e:
            raise renamed(e, {"parameters": f"{param}.function.parameters"}) from None
        if params.get("type", "object") != "object":
            raise invalid_request(
                "a function's parameters must be a JSON schema of type 'object' (the "
                f"call's arguments are a JSON object), got type {params.get('type')!r}",
                param=f"{param}.function.parameters",
            )
    known = parsed.function.model_dump(exclude_none=True, include=set(FunctionDef.model_fields))
    return {"type": "function", "function": known}, unknown_fields(parsed, f"{param}.")


def _forced_names(choice: str | dict | None, names: list[str]) -> list[str] | None:
    if choice in (None, "auto", "none"):
        return None
    if choice == "required":
        return names
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if (
            choice.get("type") != "function"
            or not isinstance(name, str)
            or set(choice)
            != {
                "type",
                "function",
            }
        ):
            raise invalid_request(
                "'tool_choice' must be 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        if name not in names:
            raise invalid_request(
                f"tool_choice names the function {name!r}, which is not in 'tools'",
                param="tool_choice",
            )
        return [name]
    raise invalid_request(
        f"'tool_choice' = {choice!r} is invalid; use 'none', 'auto', 'required' or a "
        "named function",
        param="tool_choice",
    )


# ---- rendering ----------------------------------------------------------------------


def template_knows_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` argument itself."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates
        template = " ".join(str(t) for t in template.values())
    return "tools" in template


def format_call(name: str, arguments: str) -> str:
    """One call in the calling convention (arguments: JSON text)."""
    return f'{CALL_START}\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n{CALL_END}'


def render_chat(
    messages: list[dict[str, Any]], setup: ToolSetup, native: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra apply_chat_template kwargs) for a chat with tools.

    Args:
        messages: {role, content (str), tool_calls?, tool_call_id?} dicts, roles already
            mapped (developer -> system); tool_calls in OpenAI shape (arguments a JSON
            string). setup: the request's tools. native: the template renders tools.
    """
    if native:
        out = [_native_message(m) for m in messages]
        return out, ({"tools": setup.tools} if setup.active else {})
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            body = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + body
            else:
                out.append({"role": "user", "content": body, "_tool_turn": True})
            continue
        content = m["content"]
        calls = m.get("tool_calls") or []
        if calls:
            parts = [content] if content else []
            parts += [format_call(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            content = "\n".join(parts)
        out.append({"role": m["role"], "content": content})
    for m in out:
        m.pop("_tool_turn", None)
    if setup.active:
        lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in setup.tools)
        block = _SYSTEM_TOOLS.format(tools=lines)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, {}


def _native_message(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if v is not None}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _maybe_json(c["function"]["arguments"]),
                },
            }
            for c in m["tool_calls"]
        ]
    return out


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
