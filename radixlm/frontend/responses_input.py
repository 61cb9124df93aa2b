"""``input`` of a Responses API request -> chat messages (`input_messages`).

Items (OpenAI API reference, "Create a model response", ``input``): ``message`` (roles
user / system / developer / assistant; content a string or ``input_text`` /
``output_text`` / ``text`` / ``refusal`` parts), ``function_call`` (joined onto the
assistant turn before it; ``arguments`` must be JSON text), ``function_call_output``
(a ``tool`` message; its ``call_id`` must name a ``function_call`` before it, in this
input or the earlier turns), ``reasoning`` (skipped: a chat template renders none).
Unknown fields of an item or a content part are dropped with a warning, or a 400
``unknown_parameter`` under ``--strict-request-fields``. Every error is a 400 naming
the Responses field (``input.2.call_id``, ``input.0.content.1``, ...).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from radixlm.frontend.errors import invalid_request
from radixlm.frontend.responses_protocol import unknown_parameter

logger = logging.getLogger(__name__)

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
# The fields of each input item type (``id`` and ``status`` come with replayed output
# items) and of a text content part; others are unknown (`unknown_item_fields`).
_ITEM_FIELDS = {
    "message": {"type", "role", "content", "id", "status"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
}
_PART_FIELDS = {"type", "text", "refusal", "annotations", "logprobs"}


def unknown_item_fields(value: str | list[dict[str, Any]]) -> list[str]:
    """Dotted paths of the unknown fields of ``input`` items and their content parts
    (``input.0.foo``, ``input.1.content.0.bar``), in request order; items of unknown or
    skipped types are not looked into."""
    if isinstance(value, str):
        return []
    found = []
    for i, item in enumerate(value):
        kind = item.get("type", "message" if "role" in item else None)
        fields = _ITEM_FIELDS.get(kind)
        if fields is None:
            continue
        found += [f"input.{i}.{k}" for k in item if k not in fields]
        parts = item.get("content" if kind == "message" else "output")
        where = "content" if kind == "message" else "output"
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            if isinstance(part, dict):
                found += [f"input.{i}.{where}.{j}.{k}" for k in part if k not in _PART_FIELDS]
    return found


def input_messages(
    value: str | list[dict[str, Any]], strict: bool = False, calls: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """Chat message dicts (ChatMessage fields) of a request's ``input``.

    Raises APIError (400, param ``input.<i>[.<field>]``) for a malformed or unsupported
    item (a ``function_call`` whose ``arguments`` is not JSON; a
    ``function_call_output`` whose ``call_id`` names no ``function_call`` before it, in
    `calls` (those of the earlier turns) or in this input), or (`strict`) an unknown
    field (code unknown_parameter); unknown fields are otherwise dropped with a logged
    warning.
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    unknown = unknown_item_fields(value)
    if unknown and strict:
        raise unknown_parameter(unknown[0])
    if unknown:
        logger.warning("/v1/responses: ignoring unknown fields: %s", ", ".join(unknown))
    out: list[dict[str, Any]] = []
    seen = set(calls)
    for i, item in enumerate(value):
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(i, item))
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", i),
                "type": "function",
                "function": {
                    "name": _string(item, "name", i),
                    "arguments": _json_object_text(item, i),
                },
            }
            seen.add(call["id"])
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _parts_text(output, f"input.{i}.output")
            call_id = _string(item, "call_id", i)
            if call_id not in seen:
                raise invalid_request(
                    f"no function_call with call_id {call_id!r} comes before this "
                    "function_call_output",
                    param=f"input.{i}.call_id",
                )
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            logger.warning("/v1/responses: skipping a 'reasoning' input item")
        else:
            raise invalid_request(
                f"input item type {kind!r} is not supported (message, function_call, "
                "function_call_output)",
                param=f"input.{i}.type",
                code="unsupported_parameter" if isinstance(kind, str) else "invalid_value",
            )
    if not out:
        raise invalid_request("'input' must hold at least one message", param="input")
    return out


def _message(i: int, item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise invalid_request(
            f"a message's role must be user, system, developer or assistant, got {role!r}",
            param=f"input.{i}.role",
        )
    content = item.get("content")
    if not isinstance(content, str):
        content = _parts_text(content, f"input.{i}.content")
    return {"role": role, "content": content}


def _parts_text(parts: Any, param: str) -> str:
    """The text of content parts (joined by newlines, as chat content parts are)."""
    if not isinstance(parts, list):
        raise invalid_request("must be a string or a list of text content parts", param=param)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise invalid_request(
                f"content parts of type {kind!r} are not supported (input_text, output_text)",
                param=f"{param}.{j}",
                code="unsupported_parameter",
            )
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise invalid_request(f"a {kind} part needs a text string", param=f"{param}.{j}")
        texts.append(text)
    return "\n".join(texts)


def _string(item: dict[str, Any], name: str, i: int) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid_request(
            f"a {item.get('type')} item needs a string '{name}'", param=f"input.{i}.{name}"
        )
    return value


def _json_object_text(item: dict[str, Any], i: int) -> str:
    """A function_call item's ``arguments``, which must be JSON text. Raises APIError
    (400, param ``input.<i>.arguments``) otherwise."""
    text = _string(item, "arguments", i)
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise invalid_request(
            f"a function_call's 'arguments' must be JSON text: {e.msg} at character {e.pos}",
            param=f"input.{i}.arguments",
        ) from None
    return text
