"""Configurations under evaluation: engine flags, as `radixlm serve` takes them, or the URL of
a running server.

    "--dtype bfloat16"                      unnamed, in-process
    "fp16kv=--kv-cache-dtype float16"       named "fp16kv", in-process
    "q4=http://127.0.0.1:30000"             named "q4", a running `radixlm serve`
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from radixlm.config import HTTP_ONLY_FIELDS, ServerArgs

_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class EvalConfig:
    """One configuration: `engine_args` (ServerArgs fields that differ from their
    defaults, for `radixlm.Engine(**engine_args)`) or `url` (a running server)."""

    name: str
    flags: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    url: str | None = None

    @property
    def model(self) -> str:
        """The model this configuration loads (ServerArgs' default when not given)."""
        return self.engine_args.get("model", ServerArgs.model)


class _RaisingParser(argparse.ArgumentParser):
    """An argparse parser that raises ValueError instead of printing and exiting."""

    def error(self, message: str):
        raise ValueError(message)


def _flag_parser() -> argparse.ArgumentParser:
    parser = _RaisingParser(prog="configuration", add_help=False)
    ServerArgs.add_cli_args(parser, exclude=HTTP_ONLY_FIELDS)
    return parser


def parse_engine_flags(flags: str) -> dict[str, Any]:
    """The ServerArgs fields that `flags` (e.g. "--dtype bfloat16 --kv-cache-dtype float16")
    sets to a value other than the default, checked by ServerArgs' own validation.

    Raises:
        ValueError: an unknown flag, a value outside a flag's choices, or a combination
            that ServerArgs refuses (the message says which).
    """
    try:
        tokens = shlex.split(flags)
    except ValueError as e:
        raise ValueError(f"cannot split flags {flags!r}: {e}") from None
    ns = _flag_parser().parse_args(tokens)
    args = ServerArgs.from_cli_args(ns)  # runs ServerArgs' checks
    defaults = ServerArgs()
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(ServerArgs)
        if getattr(args, f.name) != getattr(defaults, f.name)
    }


def parse_config(spec: str, default_name: str) -> EvalConfig:
    """One `--baseline` / `--candidate` value: ``[NAME=]FLAGS`` or ``[NAME=]URL``.

    Raises:
        ValueError: flags that do not parse (see `parse_engine_flags`), naming the
            configuration.
    """
    name, body = default_name, spec.strip()
    head, sep, rest = body.partition("=")
    if sep and not head.startswith("-") and _NAME.fullmatch(head):
        name, body = head, rest.strip()
    if re.match(r"^https?://", body):
        return EvalConfig(name=name, flags=body, url=body.rstrip("/"))
    try:
        engine_args = parse_engine_flags(body)
    except ValueError as e:
        raise ValueError(f"configuration {name!r} ({body!r}): {e}") from None
    return EvalConfig(name=name, flags=body, engine_args=engine_args)
