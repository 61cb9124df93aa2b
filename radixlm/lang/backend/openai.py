"""Backend for any OpenAI-compatible server (OpenAI, radixlm's /v1, vLLM, ...).

Chat models (the default) receive the program's finished messages through
`chat.completions`; a gen must then sit right at the start of an assistant turn
(``s += rl.assistant(rl.gen("answer"))``). Completion models receive the program text
through `completions`. That API cannot score given choices, constrain output with a
regex, grammar or dtype, or fill a prefix cache: `select`, `regex`/`ebnf`/`dtype`
and `return_logprob` raise `UnsupportedByBackendError`; forks and `run_batch` simply
skip the cache commit. `json_schema` is sent as ``response_format`` (chat models).

`structured_outputs` names a server's own extension for constrained output, which
completion models then use: ``"vllm"`` (vLLM's ``structured_outputs`` request field:
json_schema, regex and select, the latter as constrained decoding over the choices) or
``"llama.cpp"`` (llama-server's ``json_schema`` and ``grammar`` fields: json_schema and
select, the choices as a GBNF alternation). Such a select is greedy constrained
decoding, not the length-normalized logprob scoring of radixlm's own backends, so it
may pick another choice.
"""

from __future__ import annotations

import json
import os
from typing import Any

from radixlm.errors import InvalidRequestError, ServerError
from radixlm.lang import chat_template as templates
from radixlm.lang.backend.base import (
    Backend,
    OnDelta,
    Prompt,
    UnsupportedByBackendError,
    check_choices,
)
from radixlm.lang.choices import ChoicesDecision
from radixlm.lang.ir import SamplingOptions

_COMPLETION_ONLY = ("gpt-3.5-turbo-instruct", "davinci-002", "babbage-002")
# radixlm / SGLang / vLLM extensions, sent only when not at their neutral value.
_EXTRA = {"top_k": -1, "min_p": 0.0, "ignore_eos": False, "priority": 0}
DIALECTS = ("vllm", "llama.cpp")
# Tokens a constrained select may decode beyond one token per character of its longest
# choice (no choice needs more; the grammar ends the request after the choice).
_SELECT_SLACK_TOKENS = 4


def constraint_body(
    dialect: str,
    *,
    json_schema: str | None = None,
    regex: str | None = None,
    choices: list[str] | None = None,
) -> dict[str, Any]:
    """The request fields that constrain output in `dialect` (one of DIALECTS) to a JSON
    schema (text), a regex or one of `choices` (exactly one of them given).

    Raises UnsupportedByBackendError for what the dialect cannot express (llama.cpp: regex).
    """
    if dialect == "vllm":
        if json_schema is not None:
            return {"structured_outputs": {"json": json.loads(json_schema)}}
        if regex is not None:
            return {"structured_outputs": {"regex": regex}}
        return {"structured_outputs": {"choice": list(choices or [])}}
    if json_schema is not None:
        return {"json_schema": json.loads(json_schema)}
    if regex is not None:
        raise UnsupportedByBackendError("llama-server takes no regex constraint (GBNF only)")
    # GBNF string literals take JSON's escapes.
    return {
        "grammar": "root ::= "
        + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices or [])
    }


class OpenAI(Backend):
    """Programs on an OpenAI-compatible API.

    Args:
        model_name: the `model` field of each request.
        base_url: the API root (``http://host:port/v1``); None: OpenAI's.
        api_key: None: ``$OPENAI_API_KEY`` (or a placeholder when `base_url` is given).
        is_chat_model: use chat completions (default: True, except completion-only models).
        chat_template: the text form of roles in `s.text()` (chat models: plain lines;
            completion models: ChatML, which is also what their prompt contains).
        structured_outputs: None or one of DIALECTS: the server extension completion
            models use for json_schema, regex and select (see the module docstring).
        **client_kwargs: passed to `openai.OpenAI` (timeout, max_retries, ...).
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        is_chat_model: bool | None = None,
        chat_template: templates.ChatTemplate | None = None,
        structured_outputs: str | None = None,
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
        if structured_outputs not in (None, *DIALECTS):
            raise ValueError(
                f"structured_outputs must be one of {DIALECTS}: {structured_outputs!r}"
            )
        # Only completion requests carry the extension (chat models use response_format).
        self.dialect = None if is_chat_model else structured_outputs

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
            if options.json_schema is not None and self.dialect is None:
                raise UnsupportedByBackendError(
                    "json_schema needs an OpenAI chat model or a structured_outputs dialect"
                )
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
            if name == "regex" and self.dialect is not None:
                continue
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
        if self.dialect is not None and (options.json_schema or options.regex) is not None:
            extra.update(
                constraint_body(self.dialect, json_schema=options.json_schema, regex=options.regex)
            )
        if extra:
            kwargs["extra_body"] = extra
        if options.json_schema is not None and self.is_chat_model:
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
        """With a structured_outputs dialect (completion models): greedy decoding
        constrained to `choices` (`temperature` and `method` do not apply). Raises
        UnsupportedByBackendError without one, ServerError when the server's text is
        not one of the choices."""
        if self.dialect is not None:
            return self._constrained_select(prompt, check_choices(choices))
        raise UnsupportedByBackendError(
            "the OpenAI API cannot score given choices: select needs the Engine or "
            "RuntimeEndpoint backend (or use gen with a stop string and parse the answer)"
        )

    def _constrained_select(self, prompt: str, choices: list[str]) -> ChoicesDecision:
        body = constraint_body(self.dialect, choices=choices)
        try:
            response = self.client.completions.create(
                model=self.model_name, prompt=prompt, temperature=0,
                max_tokens=max(map(len, choices)) + _SELECT_SLACK_TOKENS, extra_body=body,
            )  # fmt: skip
        except self._openai.APIError as e:
            raise ServerError(f"OpenAI API: {e}") from e
        text = response.choices[0].text or ""
        if text not in choices:
            raise ServerError(f"constrained select answered {text!r}, not one of {choices}")
        usage = response.usage
        return ChoicesDecision(
            text,
            {
                "method": "constrained decoding",
                "completion_tokens": getattr(usage, "completion_tokens", None),
            },
        )
