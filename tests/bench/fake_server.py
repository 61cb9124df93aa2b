"""A small OpenAI-compatible / radixlm-native HTTP server for `radixlm bench` tests.

It serves GET /v1/models and streamed POST /v1/completions and /generate from a thread
(stdlib http.server, no model): every request streams `tokens` one-token chunks, or
fails with `fail_status` and an OpenAI error body; with `api_key` set, every route
answers 401 without `Authorization: Bearer <api_key>`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeConfig:
    """What the fake server answers (see the module docstring)."""

    models: list[dict[str, Any]] = field(default_factory=lambda: [{"id": "my-model"}])
    api_key: str | None = None
    tokens: int = 3
    fail_status: int | None = None
    fail_message: str = "model exploded"
    posts: list[dict[str, Any]] = field(default_factory=list)


def _handler(cfg: FakeConfig) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._json(status, {"error": {"message": message, "type": "error", "code": status}})

        def _authorized(self) -> bool:
            if cfg.api_key and self.headers.get("Authorization") != f"Bearer {cfg.api_key}":
                self._error(401, "Incorrect or missing API key")
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": cfg.models})
            else:
                self._error(404, "not found")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self._authorized():
                return
            cfg.posts.append({"path": self.path, **body})
            if cfg.fail_status is not None:
                self._error(cfg.fail_status, cfg.fail_message)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
            for event in self._events(body):
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def _events(self, body: dict[str, Any]) -> list[dict[str, Any]]:
            n = cfg.tokens
            if self.path == "/generate":
                meta = {"prompt_tokens": 5, "completion_tokens": n, "cached_tokens": 0}
                return [
                    {
                        "text": "x" * (i + 1),
                        "output_ids": list(range(i + 1)),
                        "meta_info": {**meta, "finish_reason": "length" if i == n - 1 else None},
                    }
                    for i in range(n)
                ]
            usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
            chunks: list[dict[str, Any]] = [{"choices": [{"text": "x"}]} for _ in range(n)]
            return chunks + [{"choices": [], "usage": usage}]

    return Handler


class FakeServer:
    """Context manager: `with FakeServer(cfg) as url:` serves on 127.0.0.1 (a free port)."""

    def __init__(self, cfg: FakeConfig):
        self.cfg = cfg
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cfg))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
