"""The EBNF of a Pythonic call's keyword arguments, from the tool's parameter schema.

A forced Pythonic call is ``name(key=value, ...)``: the keys are the schema's
``properties`` in their declared order (each required one present, each optional one
present or not; names that are no Python identifier cannot be keywords and are left
out), and each value is a Python literal that `ast.literal_eval` reads: a string,
int, float, ``True``/``False``, ``None``, list or dict, narrowed by the property's
``type`` (one type or a list of them) or ``enum`` where given. Nested schemas are not
narrowed further (any literal of the right outer type).
"""

from __future__ import annotations

import json
from typing import Any

_LITERALS = r"""
str ::= "\"" ([^"\\\r\n] | "\\" ["\\nrt])* "\""
int ::= "-"? ("0" | [1-9] [0-9]*)
num ::= int ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
bool ::= "True" | "False"
none ::= "None"
list ::= "[" (value (", " value)*)? "]"
dict ::= "{" (str ": " value (", " str ": " value)*)? "}"
value ::= str | num | bool | none | list | dict
"""

_BY_TYPE = {
    "string": "str",
    "integer": "int",
    "number": "num",
    "boolean": "bool",
    "null": "none",
    "array": "list",
    "object": "dict",
}


def _literal(value: Any) -> str | None:
    """The EBNF string literal of one enum value written as Python, or None for a value
    with no plain literal (lists, dicts)."""
    if isinstance(value, bool):
        text = "True" if value else "False"
    elif value is None:
        text = "None"
    elif isinstance(value, str | int | float):
        text = json.dumps(value)  # a JSON string or number is a Python literal too
    else:
        return None
    return json.dumps(text)


def _value_rule(schema: Any) -> str:
    """The EBNF expression of one property's value."""
    if not isinstance(schema, dict):
        return "value"
    if isinstance(schema.get("enum"), list):
        literals = [_literal(v) for v in schema["enum"]]
        if literals and None not in literals:
            return "(" + " | ".join(literals) + ")"
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if isinstance(kinds, list) and kinds and all(k in _BY_TYPE for k in kinds):
        return "(" + " | ".join(_BY_TYPE[k] for k in kinds) + ")"
    return "value"


def keyword_arguments_ebnf(schema: dict[str, Any]) -> str:
    """EBNF (root rule ``root``) of the text between a call's parentheses."""
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or [])
    items = [(k, _value_rule(v)) for k, v in props.items() if k.isidentifier()]
    # Rule a{i}_{c}: the arguments from the i-th on; c = 1 when one was written before
    # (so the next needs a ", " separator).
    rules = [f'a{len(items)}_0 ::= ""', f'a{len(items)}_1 ::= ""']
    for i in range(len(items) - 1, -1, -1):
        key, value = items[i]
        for c in (0, 1):
            sep = '", " ' if c else ""
            present = f'{sep}"{key}=" {value} a{i + 1}_1'
            absent = f"a{i + 1}_{c}"
            body = present if key in required else f"({present}) | {absent}"
            rules.append(f"a{i}_{c} ::= {body}")
    return "root ::= a0_0\n" + "\n".join(rules) + _LITERALS
