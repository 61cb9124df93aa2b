"""Backend over a running radixlm (or SGLang) server's native `POST /generate` route."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from radixlm.errors import InvalidRequestError, ServerError
from radixlm.lang import chat_template as templates
from radixlm.lang.backend.base import NativeBackend

logger = logging.getLogger(__name__)


def _error_message(response: httpx.Response) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an error response (OpenAI's error body, or its text)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase, None, None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        param, code = err.get("param"), err.get("code")
        return (
            str(err.get("message")),
            param if isinstance(param, str) else None,
            code if isinstance(code, str) else None,
        )
    return str(body)[:500], None, None


class RuntimeEndpoint(NativeBackend):
    """Programs on a server at `base_url` (such as ``http://127.0.0.1:30000``).

    Args:
        base_url: the server's address (without a route).
        api_key: sent as ``Authorization: Bearer <key>`` when given.
        verify: TLS verification for https URLs (httpx's `verify`).
        chat_template: role markers; default: derived from the served model's tokenizer
            when it can be loaded on this machine (`/get_model_info`'s model_path), else
            ChatML (see `chat_template.for_model`). The default is resolved here, as
            SGLang's RuntimeEndpoint does: loading a tokenizer takes seconds, which on
            first use would hold up the first program that writes a role while the
            programs started beside it run on.
        timeout: seconds to wait for one response.

    Raises:
        ServerError: the server cannot be reached or refuses `/get_model_info`.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: Any = None,
        chat_template: templates.ChatTemplate | None = None,
        timeout: float = 600.0,
    ):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            verify=True if verify is None else verify,
        )
        self._chat_template = chat_template
        self._has_tokenize = True
        self.model_info = self._call("GET", "/get_model_info")
        self.chat_template  # noqa: B018 - resolves the default now (see chat_template above)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise ServerError(f"{method} {self.base_url}{path} failed: {e}") from e
        self._raise_for_status(response, path)
        return response.json()

    def _raise_for_status(self, response: httpx.Response, path: str) -> None:
        if response.status_code < 400:
            return
        text, param, code = _error_message(response)
        message = f"{path}: HTTP {response.status_code}: {text}"
        if response.status_code in (400, 404, 422):
            raise InvalidRequestError(message, param=param, code=code)
        raise ServerError(message)

    def _load_chat_template(self) -> templates.ChatTemplate:
        return templates.for_model(self.model_info.get("model_path", ""))

    def request(self, *, text=None, input_ids=None, sampling_params, logprob=None, priority=0):
        body: dict[str, Any] = {"sampling_params": sampling_params, **(logprob or {})}
        if priority:
            body["priority"] = priority
        if text is not None:
            body["text"] = list(text)
        if input_ids is not None:
            body["input_ids"] = [list(ids) for ids in input_ids]
        results = self._call("POST", "/generate", body)
        return results if isinstance(results, list) else [results]

    def token_ids(self, texts: list[str]) -> list[list[int]] | None:
        """Each text's ids from the server's /tokenize (as /generate tokenizes text); None
        where the server refuses one. A 400 (a prompt too long) is left to the scoring
        request that follows, which reports it; any other refusal (a server
        without /tokenize, a proxy answering 401-405 or 5xx) means it is never asked again."""
        if not self._has_tokenize:
            return None
        try:
            return [self._call("POST", "/tokenize", {"prompt": t})["tokens"] for t in texts]
        except (InvalidRequestError, ServerError) as e:
            self._has_tokenize = "HTTP 400" in str(e)
            return None

    def request_stream(self, text, sampling_params, on_delta, priority=0):
        body = {"text": text, "sampling_params": sampling_params, "stream": True}
        if priority:
            body["priority"] = priority
        last: dict[str, Any] = {"text": "", "output_ids": [], "meta_info": {}}
        try:
            with self._client.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    self._raise_for_status(response, "/generate")
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:") :].strip()
                    if payload == "[DONE]":
                        break
                    event = json.loads(payload)
                    if "error" in event:
                        raise ServerError(f"/generate stream: {event['error'].get('message')}")
                    delta = event["text"][len(last["text"]) :]  # events are cumulative
                    last = event
                    if delta:
                        on_delta(delta)
        except httpx.HTTPError as e:
            raise ServerError(f"POST {self.base_url}/generate failed: {e}") from e
        return last

    def flush_cache(self) -> bool:
        try:
            self._call("POST", "/flush_cache")
        except ServerError as e:
            logger.warning("flush_cache refused: %s", e)
            return False
        return True

    def get_server_info(self) -> dict[str, Any]:
        return self._call("GET", "/get_server_info")

    def shutdown(self) -> None:
        self._client.close()
