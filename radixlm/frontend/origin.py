"""Browser-origin safety: what stops a web page open in a browser that can reach the server
from driving it, which matters most when no API key is set (the default).

Three ASGI middlewares, outermost first; refusals are OpenAI error bodies (errors.py):

- `HostCheck`: a request whose ``Host`` header names none of the allowed hosts gets 400
  ``invalid_host``, on every route (/health too). This stops DNS rebinding: a page on
  evil.example whose name is re-pointed at 127.0.0.1 reaches the server with
  ``Host: evil.example``. Allowed: the bound ``--host``, localhost, 127.0.0.1, ::1 and
  ``--allowed-hosts`` (``*``: any); ports are not compared. A server bound to all
  interfaces (0.0.0.0, ::) answers any Host unless ``--allowed-hosts`` is set, as SGLang and
  vLLM do, since its clients reach it by names it cannot know (LAN addresses, container and
  service names); it logs a warning at start.
- Starlette's ``CORSMiddleware``, only with ``--allow-origins``. Without it no response
  carries ``Access-Control-*`` headers: browsers let no other origin read an answer or send
  a preflighted request (a JSON POST is one).
- `UnsafeMethodCheck`: a POST (any method but GET, HEAD, OPTIONS) that has a body or a
  ``Content-Type`` must be JSON (``application/json`` or ``application/*+json``, any
  parameters such as charset), else 415 ``unsupported_media_type``: the bodies a page may
  send without a preflight (text/plain, forms) never reach a route. A POST whose ``Origin``
  header is neither the server's own (its host:port equals ``Host``) nor allowed by
  ``--allow-origins`` gets 403 ``origin_not_allowed``: browsers send Origin with every
  cross-origin POST, a bodiless ``POST /flush_cache`` included. Clients other than browsers
  send no Origin.

State-changing routes are POST only (app.py), so no GET (an image tag, a link) changes
state.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from radixlm.config import ServerArgs, csv_entries
from radixlm.frontend.errors import APIError, json_error

logger = logging.getLogger(__name__)

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Bind addresses meaning every interface.
_ALL_INTERFACES = frozenset({"0.0.0.0", "::", ""})
_LOOPBACK = ("localhost", "127.0.0.1", "::1")
_SHOWN = 100  # characters of a refused header value quoted in the error message


def install_origin_checks(app: FastAPI, args: ServerArgs) -> None:
    """Add the checks above to `app` (before it starts), configured from
    ``args.host``, ``args.allowed_hosts`` and ``args.allow_origins``."""
    # Browsers serialize Origin in lower case without a trailing slash.
    origins = [o.rstrip("/").lower() for o in csv_entries(args.allow_origins)]
    app.add_middleware(UnsafeMethodCheck, origins=frozenset(origins))
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
            allow_private_network=True,
        )
    hosts = allowed_hosts(args)
    if hosts is not None:
        app.add_middleware(HostCheck, allowed=hosts)
    elif not args.allowed_hosts:
        logger.warning(
            "bound to all interfaces (%r): any Host header is answered; set --allowed-hosts "
            "to the names clients use to refuse DNS-rebinding browser pages",
            args.host,
        )


def allowed_hosts(args: ServerArgs) -> frozenset[str] | None:
    """The host names (as `host_name` gives them) a Host header may name; None: any."""
    extra = csv_entries(args.allowed_hosts)
    if "*" in extra or (not extra and args.host in _ALL_INTERFACES):
        return None
    return frozenset(host_name(h) for h in (args.host, *_LOOPBACK, *extra))


def host_name(value: str) -> str:
    """The host of a Host header value or host entry: lower case, without the port, IPv6
    brackets or a trailing dot ('[::1]:30000' -> '::1', 'LocalHost.:80' -> 'localhost');
    '' for a malformed bracket."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else ""
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def media_type_is_json(content_type: str) -> bool:
    """Whether a Content-Type value is application/json or application/*+json
    (parameters such as charset ignored, case-insensitive)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class HostCheck:
    """ASGI middleware: HTTP requests whose Host names none of `allowed` get 400
    ``invalid_host`` (a missing Host too)."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]):
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = _header(scope, b"host") or ""
            if host_name(host) not in self.allowed:
                err = APIError(
                    400,
                    f"Host {host[:_SHOWN]!r} is not served here; start the server with "
                    "--allowed-hosts to add it.",
                    code="invalid_host",
                )
                await json_error(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class UnsafeMethodCheck:
    """ASGI middleware for requests other than GET, HEAD, OPTIONS: 403
    ``origin_not_allowed`` for an Origin other than the server's own and not in `origins`
    (lower case, no trailing slash, as browsers send them; '*' in it: any), then 415
    ``unsupported_media_type`` for a body or Content-Type that is not JSON."""

    def __init__(self, app: ASGIApp, origins: frozenset[str]):
        self.app = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in _SAFE_METHODS:
            err = self._refusal(scope)
            if err is not None:
                await json_error(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> APIError | None:
        origin = _header(scope, b"origin")
        if origin is not None and not self._origin_allowed(origin, _header(scope, b"host")):
            return APIError(
                403,
                f"Requests from origin {origin[:_SHOWN]!r} are not allowed; start the server "
                "with --allow-origins to allow it.",
                code="origin_not_allowed",
            )
        content_type = _header(scope, b"content-type")
        has_body = _header(scope, b"transfer-encoding") is not None or (
            _header(scope, b"content-length") or "0"
        ).strip() not in ("", "0")
        if (content_type is not None or has_body) and not media_type_is_json(content_type or ""):
            return APIError(
                415,
                f"Unsupported Content-Type {(content_type or '')[:_SHOWN]!r}: send the body "
                "as 'Content-Type: application/json'.",
                code="unsupported_media_type",
            )
        return None

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if "*" in self.origins or origin in self.origins:
            return True
        _, sep, netloc = origin.partition("://")
        return bool(sep) and host is not None and netloc == host.strip().lower()


def _header(scope: Scope, name: bytes) -> str | None:
    """The first value of header `name` (lower case) in an ASGI scope; None when absent."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None
