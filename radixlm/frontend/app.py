"""The FastAPI application: OpenAI-compatible and native routes over a TokenizerManager.

Routes:
    GET  /health                   200 while every child process beats, else 503 "unhealthy"
                                   (no API key needed)
    GET  /v1/models, /v1/models/{id}
    POST /v1/completions, /v1/chat/completions   (serving_openai.py)
    POST /v1/responses, GET / DELETE /v1/responses/{id}   (serving_responses.py)
    POST /generate                 SGLang's native route (serving_native.py)
    GET  /get_server_info          settings, KV capacity, pool counters (tokens)
    GET  /get_model_info
    POST /flush_cache              409 while requests run or wait
    POST /tokenize, /detokenize    token ids of a prompt or chat, text of ids (serving_tokens.py)
    POST /abort_request            stop requests by id (SGLang's route; serving_tokens.py)
    POST /open_session, /close_session   SGLang's sessions (serving_sessions.py)
    GET  /metrics                  Prometheus text format (metrics.py)
    GET  /openapi.json, /docs      the OpenAPI document and its Swagger UI (openapi.py)

With ``args.api_key`` set, every route but /health needs ``Authorization: Bearer <key>``
(else 401). Errors are OpenAI error bodies (errors.py). Host, CORS, Content-Type and
Origin checks: origin.py.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixlm.config import ServerArgs
from radixlm.frontend.errors import APIError, install_error_handlers, json_error
from radixlm.frontend.metrics import CONTENT_TYPE, ServerMetrics
from radixlm.frontend.openapi import install_openapi
from radixlm.frontend.origin import install_origin_checks
from radixlm.frontend.serving_native import NativeServing
from radixlm.frontend.serving_openai import OpenAIServing
from radixlm.frontend.serving_responses import ResponsesServing
from radixlm.frontend.serving_sessions import SessionServing
from radixlm.frontend.serving_tokens import TokenServing

logger = logging.getLogger(__name__)


def _api_key_check(api_key: str):
    expected = f"Bearer {api_key}".encode()

    async def check(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, expected):
            raise APIError(
                401,
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )

    return check


def create_app(tm, args: ServerArgs) -> FastAPI:
    """Build the app serving `tm` (a started TokenizerManager). Units: tokens."""
    # FastAPI's own /openapi.json and /docs would skip the API key: install_openapi serves them.
    app = FastAPI(title="radixlm", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tm = tm
    metrics = app.state.metrics = ServerMetrics()
    tm.observer = metrics
    install_error_handlers(app)
    install_origin_checks(app, args)
    openai = OpenAIServing(tm, args.allow_special_tokens_in_content)
    native = NativeServing(tm)
    tokens = TokenServing(tm, openai)
    sessions = SessionServing(tm)
    responses = ResponsesServing(openai, args.responses_store_size)
    created = int(time.time())
    auth = [Depends(_api_key_check(args.api_key))] if args.api_key else []
    api = APIRouter(dependencies=auth)

    @app.get("/health")
    async def health() -> Response:
        problem = tm.health()
        if problem is not None:  # logged by tm.health when it changes, not per probe
            return json_error(APIError(503, problem, type="server_error", code="unhealthy"))
        return Response(status_code=200)

    def model_card() -> dict[str, Any]:
        return {
            "id": tm.model_name,
            "object": "model",
            "created": created,
            "owned_by": "radixlm",
            "root": args.model,
            "max_model_len": tm.context_len,
        }

    @api.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @api.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id != tm.model_name:
            raise APIError(
                404,
                f"The model '{model_id}' does not exist",
                param="model",
                code="model_not_found",
            )
        return model_card()

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await openai.completions(request)

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await openai.chat(request)

    @api.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await responses.create(request)

    @api.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> dict[str, Any]:
        return await responses.get(response_id)

    @api.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict[str, Any]:
        return await responses.delete(response_id)

    @api.post("/generate")
    async def generate(request: Request) -> Response:
        return await native.generate(request)

    @api.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        return await asyncio.to_thread(tokens.tokenize, await request.body())

    @api.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        return await asyncio.to_thread(tokens.detokenize, await request.body())

    @api.post("/abort_request")
    async def abort_request(request: Request) -> dict[str, Any]:
        return tokens.abort(await request.body())

    @api.post("/open_session")
    async def open_session(request: Request) -> Response:
        return await sessions.open(await request.body())

    @api.post("/close_session")
    async def close_session(request: Request) -> Response:
        return await sessions.close(await request.body())

    @api.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        info = await tm.get_server_info()
        if info.get("args", {}).get("api_key"):
            info["args"] = {**info["args"], "api_key": "<redacted>"}
        return {**info, "served_model_name": tm.model_name}

    @api.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        return {
            "model_path": args.model,
            "served_model_name": tm.model_name,
            "is_generation": True,
            "context_length": tm.context_len,
            "vocab_size": tm.vocab_size,
        }

    @api.post("/flush_cache")
    async def flush_cache() -> Response:
        ok, message = await tm.flush_cache()
        if not ok:
            raise APIError(409, message, code="requests_running")
        return JSONResponse({"message": message})

    @api.get("/metrics")
    async def get_metrics() -> Response:
        info = await tm.get_server_info()
        body = metrics.render(info.get("scheduler"), info.get("replicas"))
        return Response(body, media_type=CONTENT_TYPE)

    install_openapi(app, api, secured=bool(args.api_key))
    app.include_router(api)
    return app
