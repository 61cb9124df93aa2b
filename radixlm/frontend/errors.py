"""OpenAI-style error bodies and the exception handlers that produce them.

Every error the HTTP server returns has the body

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

and a status code: 400 for bad input (never FastAPI's default 422), 401 for a missing or
wrong API key, 404 for an unknown route or model, 409 for a refused cache flush, 503 when
the queue is full or the server cannot serve, 504 for a request past --request-timeout,
500 for bugs. Every 400 has a code ("invalid_value" unless a more specific one applies,
such as "context_length_exceeded", "invalid_type", "unknown_parameter") and a param
whenever one field is at fault. The server keeps serving after any of them. Exceptions map
by their type and fields (`from_exception`), never by their text; a route renames the
runtime's field names in `param` to its own (`renamed`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from radixlm.errors import (
    EngineClosedError,
    InvalidRequestError,
    ModelNotFoundError,
    QueueFullError,
    RadixLMError,
    RequestTimeoutError,
    ServerError,
    SLOUnattainableError,
)

logger = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()


class APIError(Exception):
    """An error with its HTTP status and OpenAI error fields, raised by route handlers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


#: The code of a 400 whose cause has no more specific one (every 400 carries a code).
DEFAULT_400_CODE = "invalid_value"


def invalid_request(
    message: str, param: str | None = None, code: str = DEFAULT_400_CODE
) -> APIError:
    """A 400 `invalid_request_error` (code "invalid_value" unless a more specific one is
    given)."""
    return APIError(400, message, param=param, code=code)


def error_body(
    message: str,
    type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_exception(exc: BaseException) -> APIError:
    """Map an exception to an APIError by its type, never its text: InvalidRequestError
    (and RequestTooLargeError) 400 with its own param and code ("invalid_value" when it
    has none), ModelNotFoundError 404, QueueFullError, ServerError and EngineClosedError
    503, SLOUnattainableError 429 with Retry-After, RequestTimeoutError 504, pydantic
    errors 400, other radixlm errors and unknown ones 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return invalid_request(str(exc), exc.param, exc.code or DEFAULT_400_CODE)
    if isinstance(exc, ModelNotFoundError):
        return APIError(404, str(exc), code="model_not_found")
    if isinstance(exc, QueueFullError):
        return APIError(503, str(exc), type="server_error", code="queue_full")
    if isinstance(exc, SLOUnattainableError):
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return APIError(
            429,
            str(exc),
            type="server_error",
            code="slo_unattainable",
            headers={"Retry-After": retry},
        )
    if isinstance(exc, ValidationError):
        return _from_validation_errors(exc.errors(include_url=False))
    if isinstance(exc, RequestValidationError):
        return _from_validation_errors(list(exc.errors()))
    if isinstance(exc, ServerError):
        return APIError(503, str(exc), type="server_error")
    if isinstance(exc, EngineClosedError):
        return APIError(503, str(exc), type="server_error")
    if isinstance(exc, RequestTimeoutError):
        return APIError(504, str(exc), type="server_error", code="request_timeout")
    if isinstance(exc, RadixLMError):
        return APIError(500, str(exc), type="server_error")
    return APIError(500, "internal server error", type="server_error")


def renamed(
    exc: InvalidRequestError, names: Mapping[str, str], default: str | None = None
) -> APIError:
    """The 400 of a runtime InvalidRequestError raised for a route's request: its param
    (a runtime field name, e.g. "max_new_tokens") becomes the route's field
    (`names[param]`, e.g. "max_tokens"; `default` for a param not in `names`), its
    message and code are kept."""
    param = names.get(exc.param, default) if exc.param is not None else default
    return invalid_request(str(exc), param, exc.code or DEFAULT_400_CODE)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _param_of(loc: tuple | list) -> str | None:
    """'messages.0.content' from a pydantic location, without union member tags."""
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(str(item))
        elif isinstance(item, str) and item != "body" and not _is_type_tag(item):
            parts.append(item)
    return ".".join(parts) or None


def _is_type_tag(item: str) -> bool:
    return "[" in item or item in {"str", "int", "float", "bool", "dict", "list", "none"}


def _union_forms(errors: list[dict[str, Any]], param: str | None) -> tuple[list[str], Any] | None:
    """(accepted forms, value) when the errors are a union field's members all failing."""
    forms, value = [], None
    for err in errors:
        loc = err.get("loc", ())
        tags = [i for i, item in enumerate(loc) if isinstance(item, str) and _is_type_tag(item)]
        if not tags or _param_of(loc[: tags[0]]) != param:
            continue
        if loc[tags[0]] not in forms:
            forms.append(loc[tags[0]])
        if tags[0] == len(loc) - 1 and value is None:
            value = err.get("input")
    return (forms, value) if len(forms) > 1 else None


def _from_validation_errors(errors: list[dict[str, Any]]) -> APIError:
    """One 400 error describing the first problem pydantic found."""
    if not errors:
        return invalid_request("invalid request body")
    err = errors[0]
    kind, param = err.get("type", ""), _param_of(err.get("loc", ()))
    if kind == "json_invalid":
        return invalid_request(
            "We could not parse the JSON body of your request: "
            f"{err.get('ctx', {}).get('error', err.get('msg'))}",
            code="invalid_json",
        )
    if kind == "model_type" and param is None:
        return invalid_request("the request body must be a JSON object", code="invalid_json")
    if kind == "extra_forbidden":
        return invalid_request(
            f"Unrecognized request argument supplied: {param}",
            param=param,
            code="unknown_parameter",
        )
    if kind == "missing":
        return invalid_request(
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    union = _union_forms(errors, param)
    if union:
        return invalid_request(
            f"Invalid type for '{param}': {_short(union[1])} is none of {', '.join(union[0])}.",
            param=param,
            code="invalid_type",
        )
    return invalid_request(
        f"Invalid value for '{param}': {err.get('msg')} (got {_short(err.get('input'))}).",
        param=param,
        code="invalid_value" if "type" not in kind else "invalid_type",
    )


def log_failure(where: str, exc: BaseException, err: APIError) -> None:
    """Log a failed request: server faults (5xx) as errors with the traceback; expected
    refusals (queue full, shutting down, request timeout) as one warning line; client
    errors not at all."""
    if isinstance(
        exc,
        QueueFullError
        | SLOUnattainableError
        | ServerError
        | EngineClosedError
        | RequestTimeoutError,
    ):
        logger.warning("%s: %s", where, exc)
    elif err.status >= 500:
        logger.error("%s failed: %r", where, exc, exc_info=exc)


def json_error(err: APIError) -> Response:
    """The JSON response for an error."""
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else err.headers
    return Response(
        _encoder.encode(err.body()),
        status_code=err.status,
        media_type="application/json",
        headers=headers,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception raised by a handler to an OpenAI-style JSON error."""

    async def handle(request: Request, exc: Exception) -> Response:
        err = from_exception(exc)
        log_failure(f"{request.method} {request.url.path}", exc, err)
        return json_error(err)

    async def handle_http(request: Request, exc: StarletteHTTPException) -> Response:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return json_error(APIError(exc.status_code, str(exc.detail), type=type_))

    async def handle_gone(request: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=499)  # the client left while sending its body

    for cls in (APIError, RadixLMError, ValidationError, RequestValidationError, Exception):
        app.add_exception_handler(cls, handle)
    app.add_exception_handler(ClientDisconnect, handle_gone)
    app.add_exception_handler(StarletteHTTPException, handle_http)
