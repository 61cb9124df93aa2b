"""Backend for any OpenAI-compatible server (OpenAI, radixlm's /v1, vLLM, ...).

Chat models (the default) receive the program's finished messages through
`chat.completions`; a gen must then sit right at the start of an assistant turn
(``s += rl.assistant(rl.gen("answer"))``). Completion models receive the program text
through `completions`. That API cannot score given choices, constrain output with a
regex, grammar or dtype, or fill a prefix cache: `select`, `regex`/`ebnf`/`dtype`
and `return_logprob` raise `UnsupportedByBackendError`; forks and `run_batch` simply
skip the cache commit. `json_schema` is sent as ``response_format`` (chat models).
"""

from __future__ import annotations

import json
import os
from typing import Any

from radixlm.errors import InvalidRequestError, ServerError
from radixlm.lang import chat_template as templates
from radixlm.lang.backend.base import Backend, OnDelta, Prompt, UnsupportedByBackendError
from radixlm.lang.ir import SamplingOptions

_COMPLETION_ONLY = ("gpt-3.5-turbo-instruct", "davinci-002", "babbage-002")
# radixlm / SGLang / vLLM extensions, sent only when not at their neutral value.
_EXTRA = {"top_k": -1, "min_p": 0.0, "ignore_eos": False, "priority": 0}


class OpenAI(Backend):
    """Programs on an OpenAI-compatible API.

    Args:
        model_name: the `model` field of each request.
        base_url: the API root (``http://host:port/v1``); None: OpenAI's.
        api_key: None: ``$OPENAI_API_KEY`` (or a placeholder when `base_url` is given).
        is_chat_model: use chat completions (default: True, except completion-only models).
        chat_template: the text form of roles in `s.text()` (chat models: plain lines;
            completion models: ChatML, which is also what their prompt contains).
        **client_kwargs: passed to `openai.OpenAI` (timeout, max_retries, ...).
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        is_chat_model: bool | None = None,
        chat_template: templates.ChatTemplate | None = None,
        **client_kwargs: Any,
    ):
        import openai

        self._openai = openai
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") or ("EMPTY" if base_url else None)
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, **client_kwargs)
        self.model_name = model_name
        if is_chat_model is None:
            is_chat_model = not model_name.startswith(_COMPLETION_ONLY)
        self.is_chat_model = is_chat_model
        self._chat_template = chat_template

    def _load_chat_template(self) -> templates.ChatTemplate:
        return templates.PLAIN if self.is_chat_model else templates.CHATML

    def generate(
        self, prompt: Prompt, options: SamplingOptions, on_delta: OnDelta | None = None
    ) -> tuple[str, dict[str, Any]]:
        kwargs = self._request_kwargs(options)
        if self.is_chat_model:
            if prompt.role != "assistant" or prompt.role_text:
                raise UnsupportedByBackendError(
                    "with an OpenAI chat model, gen must come right where an assistant turn "
                    "begins (s += rl.assistant(rl.gen(...)))"
                )
            create, kwargs["messages"] = self.client.chat.completions.create, prompt.messages
        else:
            if options.json_schema is not None:
                raise UnsupportedByBackendError("json_schema needs an OpenAI chat model")
            create, kwargs["prompt"] = self.client.completions.create, prompt.text
        try:
            if on_delta is None:
                return self._result(create(**kwargs))
            return self._stream(
                create(**kwargs, stream=True, stream_options={"include_usage": True}), on_delta
            )
        except self._openai.APIStatusError as e:
            cls = InvalidRequestError if e.status_code in (400, 404, 422) else ServerError
            raise cls(f"OpenAI API: HTTP {e.status_code}: {e.message}") from e
        except self._openai.APIError as e:
            raise ServerError(f"OpenAI API: {e}") from e

    def _request_kwargs(self, options: SamplingOptions) -> dict[str, Any]:
        for name in ("regex", "ebnf", "dtype"):
            if getattr(options, name) is not None:
                raise UnsupportedByBackendError(
                    f"the OpenAI API cannot constrain a gen with {name}; use the Engine or "
                    "RuntimeEndpoint backend"
                )
        if options.return_logprob:
            raise UnsupportedByBackendError("return_logprob is not supported by the OpenAI backend")
        kwargs: dict[str, Any] = {
            "model": self.model_name,
            "max_tokens": options.max_new_tokens,
            "temperature": options.temperature,
        }
        if options.top_p not in (None, 1.0):
            kwargs["top_p"] = options.top_p
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(options, name) not in (None, 0.0):
                kwargs[name] = getattr(options, name)
        stop = [options.stop] if isinstance(options.stop, str) else list(options.stop or [])
        if stop:
            kwargs["stop"] = stop
        extra = {
            k: getattr(options, k)
            for k, neutral in _EXTRA.items()
            if getattr(options, k) not in (None, neutral)
        }
        if options.stop_token_ids:
            extra["stop_token_ids"] = list(options.stop_token_ids)
        if extra:
            kwargs["extra_body"] = extra
        if options.json_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": json.loads(options.json_schema)},
            }
        return {k: v for k, v in kwargs.items() if v is not None}

    def _meta(self, response_id: str | None, reason: str | None, usage: Any) -> dict[str, Any]:
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        return {
            "id": response_id,
            "finish_reason": None if reason is None else {"type": reason},
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
            "cached_tokens": getattr(details, "cached_tokens", None),
        }

    def _result(self, response) -> tuple[str, dict[str, Any]]:
        choice = response.choices[0]
        text = choice.message.content if self.is_chat_model else choice.text
        return text or "", self._meta(response.id, choice.finish_reason, response.usage)

    def _stream(self, chunks, on_delta: OnDelta) -> tuple[str, dict[str, Any]]:
        text, reason, usage, rid = "", None, None, None
        for chunk in chunks:
            rid = chunk.id
            usage = chunk.usage or usage
            for choice in chunk.choices:
                delta = (choice.delta.content if self.is_chat_model else choice.text) or ""
                reason = choice.finish_reason or reason
                if delta:
                    text += delta
                    on_delta(delta)
        return text, self._meta(rid, reason, usage)

    def select(self, prompt, choices, temperature, method, rng=None):
        raise UnsupportedByBackendError(
            "the OpenAI API cannot score given choices: select needs the Engine or "
            "RuntimeEndpoint backend (or use gen with a stop string and parse the answer)"
        )
