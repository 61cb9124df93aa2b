"""The OpenAPI 3.1 document of the HTTP API (GET /openapi.json) and its Swagger UI (/docs).

FastAPI derives the paths from the routes; this module adds what it cannot see:

- request bodies: the generation routes read and parse their raw body themselves (in a
  worker thread, with 400 OpenAI-style errors, never FastAPI's 422), so their pydantic
  request types (protocol.py) are added here as ``requestBody`` schemas;
- responses: per path the 200 body (response_types.py; streamed routes also
  ``text/event-stream``) and the error statuses with their OpenAI error body;
  FastAPI's 422 entries are dropped, since the server answers 400 instead;
- /generate's ``sampling_params``: a free-form dict in `GenerateRequest`, documented
  from the runtime's `SamplingParams` (unknown keys are refused; ``stop`` may be a string);
- with an API key, a bearer ``securityScheme`` required everywhere but /health.

The document is built once, on the first request for it. `DOCS` is keyed by path; a
`PathDoc` applies to every method of that path, a dict of them maps each method.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import msgspec
from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from radixlm.frontend import response_types as rt
from radixlm.frontend import responses_schema as rs
from radixlm.frontend.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from radixlm.frontend.responses_protocol import ResponsesRequest
from radixlm.frontend.serving_sessions import CloseSessionRequest, OpenSessionRequest
from radixlm.frontend.serving_tokens import AbortRequest, DetokenizeRequest, TokenizeRequest
from radixlm.runtime.sampling.sampler import SamplingParams

OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"
_REF = "#/components/schemas/{model}"
_ERRORS = {
    400: "invalid request (OpenAI error body; never 422)",
    401: "missing or wrong API key",
    404: "unknown model, (/abort_request) no running request with that id, or (Responses)"
    " an unknown response id",
    403: "a POST from a browser origin not allowed (origin.py)",
    409: "requests are running or waiting",
    415: "a POST body not sent as application/json (origin.py)",
    503: "queue full, the server cannot serve, or (on /health) a child process is silent",
    504: "the request passed --request-timeout",
}
#: Statuses every route may answer: 400 for a Host header not served (origin.py); POSTs
#: also 403 and 415; routes that wait on the scheduler 504 under --request-timeout.
_ANY_ROUTE = (400,)
_POST = (403, 415)
_WAITS_ON_SCHEDULER = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/generate",
    "/get_server_info",
    "/metrics",
    "/flush_cache",
    "/open_session",
    "/close_session",
)
# One server-sent event: its data is a JSON chunk (the route's response shape, per chunk),
# an error body, or the text [DONE] that ends the stream.
_STREAM = {
    "schema": {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string", "description": "JSON chunk or [DONE]"}},
    }
}


@dataclass(frozen=True)
class PathDoc:
    """What one path takes and answers: `request` its JSON body type (None: no body),
    `response` its 200 JSON body type (None: `media` with a string body), `stream` True
    when ``"stream": true`` answers ``text/event-stream``, `errors` its 4xx/5xx statuses
    besides 401, `examples` named valid request bodies (shown in /docs, and sent first by
    schemathesis)."""

    response: type[BaseModel] | None
    request: type[BaseModel] | None = None
    stream: bool = False
    errors: tuple[int, ...] = ()
    media: str | None = None
    examples: dict[str, dict[str, Any]] | None = None


_GENERATION_ERRORS = (400, 404, 503)
_STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}
_COMPLETION_EXAMPLES = {
    "greedy": {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0},
    "stream": {"prompt": "Once upon a time", "max_tokens": 4, **_STREAM_USAGE},
    "echo_logprobs": {"prompt": ["Hello", "Hi"], "max_tokens": 2, "echo": True, "logprobs": 2},
}
_HI = [{"role": "user", "content": "Hi"}]
_CHAT_EXAMPLES = {
    "greedy": {"messages": _HI, "max_completion_tokens": 4, "temperature": 0},
    "stream": {"messages": _HI, "max_tokens": 4, "n": 2, **_STREAM_USAGE},
    "logprobs": {"messages": _HI, "max_tokens": 4, "logprobs": True, "top_logprobs": 2},
}
_SHORT = {"max_new_tokens": 4, "temperature": 0}
_GENERATE_EXAMPLES = {
    "text": {"text": "Once upon a time", "sampling_params": _SHORT},
    "stream": {"text": "Once upon a time", "sampling_params": _SHORT, "stream": True},
    "batch_logprobs": {
        "input_ids": [[1, 2, 3], [4, 5]],
        "sampling_params": _SHORT,
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    },
}

_RESPONSES_EXAMPLES = {
    "text": {"input": "Hi", "max_output_tokens": 4, "temperature": 0},
    "stream": {"input": "Hi", "max_output_tokens": 4, "stream": True, "store": False},
}

DOCS: dict[str, PathDoc | dict[str, PathDoc]] = {
    "/health": PathDoc(None, errors=(503,)),
    "/v1/models": PathDoc(rt.ModelList),
    "/v1/models/{model_id}": PathDoc(rt.ModelCard, errors=(404,)),
    "/v1/completions": PathDoc(
        rt.CompletionResponse,
        CompletionRequest,
        stream=True,
        errors=_GENERATION_ERRORS,
        examples=_COMPLETION_EXAMPLES,
    ),
    "/v1/chat/completions": PathDoc(
        rt.ChatCompletionResponse,
        ChatCompletionRequest,
        stream=True,
        errors=_GENERATION_ERRORS,
        examples=_CHAT_EXAMPLES,
    ),
    "/v1/responses": PathDoc(
        rs.ResponseObject,
        ResponsesRequest,
        stream=True,
        errors=_GENERATION_ERRORS,
        examples=_RESPONSES_EXAMPLES,
    ),
    "/v1/responses/{response_id}": {
        "get": PathDoc(rs.ResponseObject, errors=(404,)),
        "delete": PathDoc(rs.ResponseDeleted, errors=(404,)),
    },
    "/generate": PathDoc(
        rt.GenerateResponse,
        GenerateRequest,
        stream=True,
        errors=(400, 503),
        examples=_GENERATE_EXAMPLES,
    ),
    "/get_server_info": PathDoc(rt.ServerInfo),
    "/get_model_info": PathDoc(rt.ModelInfo),
    "/flush_cache": PathDoc(rt.FlushCacheResponse, errors=(409,)),
    "/metrics": PathDoc(None, media="text/plain"),
    "/tokenize": PathDoc(
        rt.TokenizeResponse,
        TokenizeRequest,
        errors=(400,),
        examples={"prompt": {"prompt": "Hello"}, "messages": {"messages": _HI}},
    ),
    "/detokenize": PathDoc(
        rt.DetokenizeResponse,
        DetokenizeRequest,
        errors=(400,),
        examples={"ids": {"tokens": [1, 2]}},
    ),
    "/abort_request": PathDoc(
        rt.AbortResponse,
        AbortRequest,
        errors=(400, 404),
        examples={"all": {"abort_all": True}},
    ),
    "/open_session": PathDoc(
        None,
        OpenSessionRequest,
        errors=(400,),
        media="application/json",
        examples={"new": {"capacity_of_str_len": 1024}},
    ),
    "/close_session": PathDoc(None, CloseSessionRequest, errors=(400,)),
}
_PUBLIC = ("/health",)  # no API key needed


def build_openapi(app: FastAPI, secured: bool) -> dict[str, Any]:
    """The OpenAPI document of `app`'s routes with `DOCS` applied; `secured`: the server
    has an API key. Raises KeyError when `DOCS` names a path the app does not serve."""
    doc = get_openapi(
        title=app.title,
        version=version("radixlm"),
        description="OpenAI-compatible and SGLang-native LLM serving (radixlm).",
        routes=app.routes,
    )
    docs = [d for v in DOCS.values() for d in (v.values() if isinstance(v, dict) else [v])]
    documented = (m for d in docs for m in (d.request, d.response) if m is not None)
    models = list(dict.fromkeys((rt.ErrorResponse, *documented)))
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas.update(defs["$defs"])
    _document_native_sampling(schemas)
    for path, by_method in DOCS.items():
        for method, operation in doc["paths"][path].items():
            d = by_method[method] if isinstance(by_method, dict) else by_method
            extra = _ANY_ROUTE + (_POST if method == "post" else ())
            extra += (504,) if path in _WAITS_ON_SCHEDULER else ()
            _document(operation, d, secured and path not in _PUBLIC, extra)
            if secured and path in _PUBLIC:
                operation["security"] = []
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


def _document_native_sampling(schemas: dict[str, Any]) -> None:
    """Add the SamplingParams schema and make GenerateRequest.sampling_params use it."""
    (ref,), components = msgspec.json.schema_components(
        [SamplingParams], ref_template=_REF.replace("{model}", "{name}")
    )
    params = components["SamplingParams"]
    params["additionalProperties"] = False
    stop = params["properties"]["stop"]  # SGLang also takes one string
    array = {"type": stop.pop("type"), "items": stop.pop("items")}
    stop["anyOf"] = [{"type": "string"}, array]
    schemas.update(components)
    field = schemas["GenerateRequest"]["properties"]["sampling_params"]
    field["anyOf"] = [ref, {"type": "array", "items": ref}, {"type": "null"}]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _document(op: dict[str, Any], d: PathDoc, secured: bool, extra: tuple[int, ...]) -> None:
    """Set `op`'s requestBody and responses from `d`; `secured`: 401 is possible; `extra`:
    error statuses the route answers besides `d.errors`."""
    if d.request is not None:
        body: dict[str, Any] = {"schema": _ref(d.request)}
        if d.examples:
            body["examples"] = {name: {"value": v} for name, v in d.examples.items()}
        op["requestBody"] = {"required": True, "content": {"application/json": body}}
    ok: dict[str, Any] = {"description": "OK"}
    if d.response is not None:
        ok["content"] = {"application/json": {"schema": _ref(d.response)}}
        if d.stream:
            ok["content"]["text/event-stream"] = _STREAM
    elif d.media is not None:
        ok["content"] = {d.media: {"schema": {"type": "string"}}}
    responses = {"200": ok}
    statuses = {*d.errors, *extra, *((401,) if secured else ())}
    for status in sorted(statuses):
        responses[str(status)] = {
            "description": _ERRORS[status],
            "content": {"application/json": {"schema": _ref(rt.ErrorResponse)}},
        }
    op["responses"] = responses


def install_openapi(app: FastAPI, router: APIRouter, secured: bool) -> None:
    """Serve the document at OPENAPI_PATH and Swagger UI at DOCS_PATH on `router` (so
    they need the API key when the router does); `app.openapi()` returns the document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, secured)
        return app.openapi_schema

    app.openapi = openapi

    @router.get(OPENAPI_PATH, include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        return JSONResponse(openapi())

    @router.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=OPENAPI_PATH, title=f"{app.title} API")
