"""Streaming HTTP clients that time one request each (httpx, asyncio).

Backends:
    radixlm  radixlm's native `POST /generate` with `"stream": true`; every event holds
             the output so far (`output_ids`), so token counts per event are exact, and
             `meta_info.cached_tokens` gives the prefix-cache hits.
    openai   `POST /v1/completions` with `"stream": true` and
             `stream_options.include_usage` on any OpenAI-compatible server (radixlm,
             vLLM, llama.cpp's llama-server, SGLang). Output tokens come from the final
             usage chunk (else one per text chunk); cached tokens from
             `usage.prompt_tokens_details.cached_tokens` or llama-server's
             `timings.cache_n` when present.

Both send greedy requests (temperature 0) with `ignore_eos` (unless disabled) and
`max_tokens` = the workload's output length, so every engine produces the same number
of tokens.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from typing import Any

import httpx

from radixlm.bench.stats import RequestResult


def error_detail(resp: httpx.Response, limit: int = 300) -> str:
    """The message of a read response's OpenAI-style error body ({"error": {"message":
    ...}}), else its text; whitespace collapsed to one line, at most `limit` chars."""
    try:
        err = resp.json()["error"]
        text = err.get("message", err) if isinstance(err, dict) else err
    except (ValueError, KeyError, TypeError):
        text = resp.text
    return " ".join(str(text).split())[:limit]


def error_message(e: Exception, limit: int = 300) -> str:
    """One line for a failed request: a server-reported error (RuntimeError) as is,
    else "ExceptionType: message" (the type alone when the message is empty)."""
    text = " ".join(str(e).split())
    if not isinstance(e, RuntimeError):
        text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text[:limit]


class Backend(ABC):
    """Sends one streamed request and times it.

    Args:
        base_url: server root such as ``http://127.0.0.1:30000`` (no ``/v1``).
        model: model name sent in OpenAI requests. api_key: bearer token or None.
        ignore_eos: ask the server to generate exactly max_tokens.
    """

    name = ""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        ignore_eos: bool = True,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.ignore_eos = ignore_eos
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @abstractmethod
    def request(self, prompt: str | list[int], output_len: int) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of a streamed request; `prompt` is text or token ids."""

    @abstractmethod
    def parse(self, event: dict[str, Any], state: dict[str, Any]) -> tuple[str, int]:
        """(new text, new output tokens) of one event; may fill `state` with
        prompt_tokens / output_tokens / cached_tokens. Raises RuntimeError for an error
        event."""

    async def send(
        self, client: httpx.AsyncClient, prompt: str | list[int], output_len: int
    ) -> RequestResult:
        """Send one request; a failure is returned as `success=False` with its error."""
        path, body = self.request(prompt, output_len)
        res = RequestResult()
        state: dict[str, Any] = {}
        texts: list[str] = []
        chunks = 0
        res.start = last = time.perf_counter()
        try:
            async with client.stream(
                "POST", self.base_url + path, json=body, headers=self.headers
            ) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise RuntimeError(f"HTTP {resp.status_code}: {error_detail(resp)}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    text, n_new = self.parse(json.loads(data), state)
                    if not (text or n_new):
                        continue
                    now = time.perf_counter()
                    if chunks == 0:
                        res.ttft = now - res.start
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += max(n_new, 1)
                    texts.append(text)
            res.e2e = time.perf_counter() - res.start
        except (httpx.HTTPError, RuntimeError, ValueError) as e:
            res.error = error_message(e)
            return res
        res.text = "".join(texts)
        res.output_tokens = state.get("output_tokens", chunks)
        res.prompt_tokens = state.get("prompt_tokens", 0)
        res.cached_tokens = state.get("cached_tokens")
        res.success = res.output_tokens > 0
        if not res.success:
            res.error = "no output tokens"
        return res


class NativeBackend(Backend):
    """radixlm's `POST /generate` (cumulative events)."""

    name = "radixlm"

    def request(self, prompt: str | list[int], output_len: int) -> tuple[str, dict[str, Any]]:
        params = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": self.ignore_eos}
        key = "input_ids" if isinstance(prompt, list) else "text"
        return "/generate", {key: prompt, "sampling_params": params, "stream": True}

    def parse(self, event: dict[str, Any], state: dict[str, Any]) -> tuple[str, int]:
        if "error" in event:
            err = event["error"]
            raise RuntimeError(str(err.get("message", err) if isinstance(err, dict) else err))
        seen_text, seen_ids = state.get("_text", 0), state.get("_ids", 0)
        text, ids = event.get("text", ""), event.get("output_ids", [])
        state["_text"], state["_ids"] = len(text), len(ids)
        meta = event.get("meta_info", {})
        if meta.get("finish_reason") is not None:
            state["prompt_tokens"] = meta.get("prompt_tokens", 0)
            state["output_tokens"] = meta.get("completion_tokens", len(ids))
            if meta.get("cached_tokens") is not None:
                state["cached_tokens"] = meta["cached_tokens"]
        return text[seen_text:], len(ids) - seen_ids


class OpenAICompletionsBackend(Backend):
    """`POST /v1/completions` on any OpenAI-compatible server."""

    name = "openai"

    def request(self, prompt: str | list[int], output_len: int) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": output_len,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        return "/v1/completions", body

    def parse(self, event: dict[str, Any], state: dict[str, Any]) -> tuple[str, int]:
        if "error" in event:
            err = event["error"]
            raise RuntimeError(str(err.get("message", err) if isinstance(err, dict) else err))
        usage = event.get("usage")
        if usage:
            state["prompt_tokens"] = usage.get("prompt_tokens", 0)
            state["output_tokens"] = usage.get("completion_tokens", 0)
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                state["cached_tokens"] = details["cached_tokens"]
        timings = event.get("timings")  # llama-server
        if isinstance(timings, dict) and "cache_n" in timings:
            state.setdefault("cached_tokens", timings["cache_n"])
        choices = event.get("choices") or []
        text = choices[0].get("text") or "" if choices else ""
        return text, 0


BACKENDS: dict[str, type[Backend]] = {
    NativeBackend.name: NativeBackend,
    OpenAICompletionsBackend.name: OpenAICompletionsBackend,
}


def make_backend(name: str, base_url: str, **kwargs: Any) -> Backend:
    """Backend by name ('radixlm' or 'openai'). Raises ValueError for another name."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {sorted(BACKENDS)}")
    return BACKENDS[name](base_url, **kwargs)
