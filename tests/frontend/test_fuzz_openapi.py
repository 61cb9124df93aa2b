"""The published OpenAPI document, and a bounded schemathesis fuzz run against the real server.

Every operation of /openapi.json gets its documented request examples, then
FUZZ_EXAMPLES generated requests (valid and invalid bodies, fixed seed, deterministic,
no shrinking, no example database), and each answer must be no 5xx, have a
documented status and content type, and a body matching its documented schema. To keep
the run short on CPU, generated token budgets are clamped (`_clamp_budgets`) before
sending: max_tokens / max_completion_tokens / max_output_tokens / max_new_tokens / min tokens to
FUZZ_MAX_TOKENS and n / best_of to FUZZ_MAX_COPIES.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig

from radixlm.config import ServerArgs
from radixlm.frontend.app import create_app

from .conftest import API_KEY, MODEL

FUZZ_EXAMPLES = 50  # fuzzed requests per operation
FUZZ_MAX_TOKENS = 4
FUZZ_MAX_COPIES = 2
_AUTH = {"Authorization": f"Bearer {API_KEY}"}
_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "min_tokens")
_NATIVE_TOKEN_FIELDS = ("max_new_tokens", "min_new_tokens")
_COPY_FIELDS = ("n", "best_of")
_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _config() -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {
            "seed": 40,
            "generation": {
                "max-examples": FUZZ_EXAMPLES,
                "mode": "all",
                "deterministic": True,
                "no-shrink": True,
                "database": "none",
                # The key is always sent: fuzzing it only answers 401 (test_errors covers it).
                "with-security-parameters": False,
            },
            # examples (the document's request examples, sent once) and fuzzing; the
            # coverage phase's boundary cases take minutes on CPU.
            "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
        }
    )


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server}/openapi.json", headers=_AUTH, config=_config())


schema = schemathesis.pytest.from_fixture("api_schema")


def _cap(body: dict[str, Any], names: tuple[str, ...], limit: int) -> None:
    for name in names:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            body[name] = limit


def _clamp_budgets(body: Any) -> None:
    """Clamp generated token budgets and copy counts in a request body, in place (only
    integers above the cap change: invalid values still reach the server)."""
    if not isinstance(body, dict):
        return
    _cap(body, _TOKEN_FIELDS, FUZZ_MAX_TOKENS)
    _cap(body, _COPY_FIELDS, FUZZ_MAX_COPIES)
    # Without a budget, chat and Responses generate up to the context (minutes on a busy
    # CPU): give them the cap, as /generate below.
    budget = {"messages": ("max_tokens", "max_completion_tokens"), "input": ("max_output_tokens",)}
    for key, fields in budget.items():
        if key in body and all(body.get(f) is None for f in fields):
            body[fields[0]] = FUZZ_MAX_TOKENS  # absent or null: the route's default
    params = body.get("sampling_params")
    for p in params if isinstance(params, list) else [params]:
        if isinstance(p, dict):
            _cap(p, _NATIVE_TOKEN_FIELDS, FUZZ_MAX_TOKENS)
            if not isinstance(p.get("max_new_tokens"), int):  # /generate's default is 128
                p.setdefault("max_new_tokens", FUZZ_MAX_TOKENS)


@schema.parametrize()
def test_fuzz_operation(case, server):
    _clamp_budgets(case.body)
    case.call_and_validate(base_url=server, headers=_AUTH, checks=_CHECKS, timeout=60)


def test_openapi_documents_every_route(http):
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    routes = {
        "/health": {"get"},
        "/v1/models": {"get"},
        "/v1/models/{model_id}": {"get"},
        "/v1/completions": {"post"},
        "/v1/chat/completions": {"post"},
        "/v1/responses": {"post"},
        "/v1/responses/{response_id}": {"get", "delete"},
        "/generate": {"post"},
        "/get_server_info": {"get"},
        "/get_model_info": {"get"},
        "/flush_cache": {"post"},
        "/metrics": {"get"},
        "/tokenize": {"post"},
        "/detokenize": {"post"},
        "/abort_request": {"post"},
        "/open_session": {"post"},
        "/close_session": {"post"},
    }
    assert {p: set(ops) for p, ops in doc["paths"].items()} == routes
    bodies = {
        "/v1/completions": "CompletionRequest",
        "/v1/chat/completions": "ChatCompletionRequest",
        "/generate": "GenerateRequest",
    }
    for path, model in bodies.items():
        op = doc["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}"
        # 403 / 415: origin checks on every POST; 504: --request-timeout.
        assert set(op["responses"]) == {"200", "400", "401", "403", "415", "503", "504"} | (
            set() if path == "/generate" else {"404"}
        )
        assert "text/event-stream" in op["responses"]["200"]["content"]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "422" not in op["responses"]  # the server answers 400, never 422
            assert op.get("security") == ([] if path == "/health" else None)
            assert "400" in op["responses"]  # a Host not served, on every route
    assert set(doc["paths"]["/health"]["get"]["responses"]) == {"200", "400", "503"}
    assert doc["security"] == [{"bearer": []}]
    schemas = doc["components"]["schemas"]
    # Unknown fields are ignored (with a warning) unless --strict-request-fields.
    assert schemas["CompletionRequest"]["additionalProperties"] is True
    assert schemas["ErrorResponse"]["required"] == ["error"]


def test_openapi_without_a_key_has_no_security():
    args = ServerArgs(model=MODEL)
    tm = SimpleNamespace(tokenizer=None, model_name=MODEL, context_len=8192, args=args)
    doc = create_app(tm, args).openapi()
    assert "security" not in doc and "securitySchemes" not in doc["components"]
    responses = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert set(responses) == {"200", "400", "403", "404", "415", "503", "504"}
    sampling = doc["components"]["schemas"]["GenerateRequest"]["properties"]["sampling_params"]
    assert sampling["anyOf"][0] == {"$ref": "#/components/schemas/SamplingParams"}
    params = doc["components"]["schemas"]["SamplingParams"]
    assert params["additionalProperties"] is False
    assert params["properties"]["max_new_tokens"]["default"] == 128


def test_openapi_and_docs_need_the_key(server, http):
    for path in ("/openapi.json", "/docs"):
        r = httpx.get(f"{server}{path}")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    docs = http.get("/docs")
    assert docs.status_code == 200
    assert docs.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in docs.text
