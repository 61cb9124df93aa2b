"""The ``$ref`` values of a JSON schema that a grammar cannot follow.

xgrammar resolves a ``$ref`` only inside the schema itself (``#`` or a JSON pointer
``#/...``); any other reference (``http://...``, ``other.json#/x``, an ``$id``-relative
name, an anchor ``#name``) it leaves unconstrained, so a constrained request would get
any value there. Nothing is fetched from outside the request, so such references are
refused (`unresolvable_ref`) instead.

The walk visits what xgrammar visits: the subschemas of the JSON Schema 2020-12 and
draft 7 applicator keywords, from the root, and the targets of local pointers (so a
definition no reference reaches is not checked, and one under a non-standard key such as
OpenAPI's ``components/schemas`` is). A property named ``$ref``, or a ``"$ref"`` key
inside ``enum`` / ``const`` / ``default`` / ``examples`` / vendor ``x-...`` data, is not
taken for a reference.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

# Keywords whose value is one subschema.
_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
# Keywords whose value is a list of subschemas ("items" in draft 7's tuple form too).
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
# Keywords whose value maps names to subschemas (draft 7 "dependencies" may map a name to
# a list of property names instead, which holds no schema).
_MAP = ("properties", "patternProperties", "dependentSchemas", "dependencies")

_MISSING = object()


def unresolvable_ref(schema: Any) -> str | None:
    """The first ``$ref`` reachable in `schema` (a parsed JSON schema) that is neither
    ``#`` nor a pointer ``#/...``, or None when every reference stays inside the schema.
    A local pointer to nothing is left to xgrammar, which refuses it."""
    stack, seen = [schema], set()
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref != "#" and not ref.startswith("#/"):
                return ref
            target = _pointer(schema, ref[1:])
            if target is not _MISSING:
                stack.append(target)
        for key in _ONE:
            stack.append(node.get(key))
        for key in _LIST:
            value = node.get(key)
            if isinstance(value, list):
                stack.extend(value)
        for key in _MAP:
            value = node.get(key)
            if isinstance(value, dict):
                stack.extend(value.values())
    return None


def _pointer(root: Any, pointer: str) -> Any:
    """The value at JSON pointer `pointer` (RFC 6901, URI-fragment form without its
    ``#``: ``/a/b~1c``) in `root`, or _MISSING."""
    node = root
    for part in pointer.split("/")[1:]:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def structural_tag_ref(tag: Any) -> str | None:
    """`unresolvable_ref` over every JSON schema in a parsed xgrammar structural tag (its
    ``{"type": "json_schema", "json_schema": {...}}`` formats), or None."""
    stack = [tag]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("type") == "json_schema" and "json_schema" in node:
                ref = unresolvable_ref(node["json_schema"])
                if ref is not None:
                    return ref
            else:
                stack.extend(node.values())
    return None
