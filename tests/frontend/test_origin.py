"""Browser-origin safety (frontend/origin.py): Host checked against the bind address, CORS
off unless --allow-origins, POST bodies must be JSON, cross-origin POSTs refused, and
/flush_cache POST only. Most tests run the app in-process over a fake TokenizerManager
(no model); the last ones check the wiring on the real server."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.testclient import TestClient

from radixlm.config import ServerArgs
from radixlm.frontend.app import create_app
from radixlm.frontend.origin import host_name, media_type_is_json

BASE = "http://127.0.0.1:30000"
JSON_ROUTES = ["/v1/completions", "/v1/chat/completions", "/generate"]
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type",
}


class FakeTokenizerManager:
    """What create_app and the route handlers read before a request reaches the model."""

    model_name = "fake"
    context_len = 64
    vocab_size = 100
    tokenizer = None
    observer = None
    args = ServerArgs()

    def __init__(self):
        self.flushes = 0

    async def flush_cache(self) -> tuple[bool, str]:
        self.flushes += 1
        return True, "Cache flushed."

    async def get_server_info(self) -> dict:
        return {}

    def health(self) -> str | None:
        """Every child process beats (see TokenizerManager.health)."""
        return None


def make_client(**args) -> tuple[TestClient, FakeTokenizerManager]:
    tm = FakeTokenizerManager()
    app = create_app(tm, ServerArgs(**args))
    return TestClient(app, base_url=BASE, raise_server_exceptions=False), tm


def error_of(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["code"] == code
    return err


def cors_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.startswith("access-control-")}


@pytest.mark.parametrize(
    "value,name",
    [
        ("LocalHost.:80", "localhost"),
        ("[::1]:30000", "::1"),
        ("[::1]", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1", ""),
        ("api.example:8080", "api.example"),
    ],
)
def test_host_name(value, name):
    assert host_name(value) == name


@pytest.mark.parametrize(
    "value,ok",
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/vnd.api+json", True),
        ("text/plain", False),
        ("text/plain; charset=utf-8", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("", False),
    ],
)
def test_media_type_is_json(value, ok):
    assert media_type_is_json(value) is ok


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:30000", "127.0.0.1:30000", "[::1]:30000", "LOCALHOST.:1"]
)
def test_loopback_hosts_accepted(host):
    client, _ = make_client()
    assert client.get("/health", headers={"Host": host}).status_code == 200
    assert client.get("/v1/models", headers={"Host": host}).json()["data"][0]["id"] == "fake"


@pytest.mark.parametrize("route", ["/health", "/v1/models", "/get_model_info"])
def test_foreign_host_rejected(route):
    client, _ = make_client()
    resp = client.get(route, headers={"Host": "evil.example:30000"})
    assert "evil.example:30000" in error_of(resp, 400, "invalid_host")["message"]


def test_foreign_host_rejected_before_anything_runs():
    client, tm = make_client()
    resp = client.post("/flush_cache", headers={"Host": "evil.example"})
    error_of(resp, 400, "invalid_host")
    assert tm.flushes == 0


def test_bound_host_accepted():
    client, _ = make_client(host="box.lan")
    assert client.get("/health", headers={"Host": "box.lan:30000"}).status_code == 200
    assert client.get("/health", headers={"Host": "localhost"}).status_code == 200
    error_of(client.get("/health", headers={"Host": "other.lan"}), 400, "invalid_host")


def test_allowed_hosts_extend_the_defaults():
    client, _ = make_client(allowed_hosts="api.example, [fd00::5]")
    for host in ["api.example:8080", "API.example", "[fd00::5]:30000", "127.0.0.1:30000"]:
        assert client.get("/health", headers={"Host": host}).status_code == 200, host
    error_of(client.get("/health", headers={"Host": "evil.example"}), 400, "invalid_host")


def test_allowed_hosts_star_allows_any():
    client, _ = make_client(allowed_hosts="*")
    assert client.get("/health", headers={"Host": "evil.example"}).status_code == 200


def test_all_interfaces_answer_any_host_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="radixlm.frontend.origin"):
        client, _ = make_client(host="0.0.0.0")
    assert "--allowed-hosts" in caplog.text
    assert client.get("/health", headers={"Host": "10.1.2.3:30000"}).status_code == 200


def test_all_interfaces_with_allowed_hosts_restrict():
    client, _ = make_client(host="::", allowed_hosts="api.example")
    assert client.get("/health", headers={"Host": "api.example"}).status_code == 200
    assert client.get("/health", headers={"Host": "localhost:30000"}).status_code == 200
    error_of(client.get("/health", headers={"Host": "10.1.2.3"}), 400, "invalid_host")


def test_no_cors_headers_by_default():
    client, _ = make_client()
    origin = {"Origin": "http://localhost:3000"}
    preflight = client.options("/v1/completions", headers={**origin, **PREFLIGHT})
    assert preflight.status_code == 405
    assert cors_headers(preflight) == {}
    assert cors_headers(client.get("/v1/models", headers=origin)) == {}


def test_allow_origins_answers_preflight():
    client, _ = make_client(allow_origins="http://LocalHost:3000/, https://app.example")
    origin = {"Origin": "http://localhost:3000"}
    preflight = client.options("/v1/chat/completions", headers={**origin, **PREFLIGHT})
    assert preflight.status_code == 200
    cors = cors_headers(preflight)
    assert cors["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in cors["access-control-allow-methods"]
    assert "content-type" in cors["access-control-allow-headers"].lower()
    resp = client.get("/v1/models", headers=origin)
    assert resp.headers["access-control-allow-origin"] == "http://localhost:3000"
    # An origin not listed gets no grant.
    other = client.options(
        "/v1/completions", headers={"Origin": "http://evil.example", **PREFLIGHT}
    )
    assert "access-control-allow-origin" not in other.headers


def test_allow_origins_star():
    client, _ = make_client(allow_origins="*")
    resp = client.get("/v1/models", headers={"Origin": "http://anything.example"})
    assert resp.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("route", JSON_ROUTES)
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_non_json_body_is_415(route, content_type):
    client, _ = make_client()
    headers = {"Content-Type": content_type} if content_type else {}
    resp = client.post(route, content=b'{"prompt": "hi", "text": "hi"}', headers=headers)
    error_of(resp, 415, "unsupported_media_type")


@pytest.mark.parametrize("route", JSON_ROUTES)
@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "application/x+json"]
)
def test_json_body_reaches_the_route(route, content_type):
    client, _ = make_client()
    resp = client.post(route, content=b"[1]", headers={"Content-Type": content_type})
    error_of(resp, 400, "invalid_json")  # the route's own parser answered


def test_flush_cache_is_post_only():
    client, tm = make_client()
    error_of(client.get("/flush_cache"), 405, None)
    assert tm.flushes == 0
    assert client.post("/flush_cache").json() == {"message": "Cache flushed."}
    assert client.post("/flush_cache", json={}).status_code == 200
    assert tm.flushes == 2
    error_of(
        client.post("/flush_cache", content=b"x", headers={"Content-Type": "text/plain"}),
        415,
        "unsupported_media_type",
    )
    assert tm.flushes == 2


def test_cross_origin_post_refused():
    client, tm = make_client()
    for origin in ["http://evil.example", "null", "http://127.0.0.1:8080"]:
        resp = client.post("/flush_cache", headers={"Origin": origin})
        error_of(resp, 403, "origin_not_allowed")
    assert tm.flushes == 0
    # The server's own origin (a page it served) and a GET from anywhere are fine.
    assert client.post("/flush_cache", headers={"Origin": BASE}).status_code == 200
    assert client.get("/v1/models", headers={"Origin": "http://evil.example"}).status_code == 200
    assert tm.flushes == 1


def test_allowed_origin_may_post():
    client, tm = make_client(allow_origins="http://localhost:3000")
    origin = {"Origin": "http://localhost:3000"}
    resp = client.post("/flush_cache", headers=origin)
    assert resp.status_code == 200
    assert resp.headers["access-control-allow-origin"] == "http://localhost:3000"
    error_of(
        client.post("/flush_cache", headers={"Origin": "http://x.example"}),
        403,
        "origin_not_allowed",
    )
    assert tm.flushes == 1


@pytest.mark.parametrize(
    "args",
    [{"allowed_hosts": "http://api.example"}, {"allow_origins": "localhost:3000"}],
)
def test_bad_flag_values_refused(args):
    with pytest.raises(ValueError):
        ServerArgs(**args)


# ---- the real server (shared fixture: 127.0.0.1, an API key) ----------------------------


def test_server_refuses_foreign_host(http):
    error_of(http.get("/health", headers={"Host": "evil.example"}), 400, "invalid_host")
    assert http.get("/health", headers={"Host": "localhost"}).status_code == 200


def test_server_refuses_text_plain_json(http):
    body = b'{"prompt": "hi", "max_tokens": 1}'
    resp = http.post("/v1/completions", content=body, headers={"Content-Type": "text/plain"})
    error_of(resp, 415, "unsupported_media_type")


def test_server_flush_cache_get_is_405(http):
    error_of(http.get("/flush_cache"), 405, None)
    assert (
        cors_headers(http.options("/generate", headers={"Origin": "http://x", **PREFLIGHT})) == {}
    )
