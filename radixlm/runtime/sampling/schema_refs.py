"""The ``$ref`` values of a JSON schema that a grammar cannot follow.

xgrammar resolves a ``$ref`` only inside the schema itself (``#`` or a JSON pointer
``#/...``); any other reference (``http://...``, ``other.json#/x``, an ``$id``-relative
name, an anchor ``#name``) it leaves unconstrained, so a constrained request would get
any value there. Nothing is fetched from outside the request, so such references are
refused (`unresolvable_ref`) instead.

Only subschema positions are walked (JSON Schema 2020-12 and draft 7 applicator keywords),
so a property named ``$ref``, or a ``"$ref"`` key inside ``enum`` / ``const`` / ``default``
/ ``examples`` / vendor ``x-...`` data, is not taken for a reference.
"""

from __future__ import annotations

from typing import Any

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
_MAP = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
)


def unresolvable_ref(schema: Any) -> str | None:
    """The first ``$ref`` in `schema` (a parsed JSON schema) that is neither ``#`` nor a
    pointer ``#/...``, or None when every reference stays inside the schema."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and ref != "#" and not ref.startswith("#/"):
            return ref
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
