"""Token utility routes: `POST /tokenize`, `POST /detokenize` (vLLM's shapes) and
`POST /abort_request` (SGLang's).

- /tokenize {"prompt": str, "add_special_tokens": true} or {"messages": [...], "tools"?,
  "tool_choice"?} -> {"tokens": [int], "count": int, "max_model_len": int}: a prompt as
  /v1/completions and /generate encode it (the tokenizer's default special tokens unless
  add_special_tokens is false), messages as /v1/chat/completions renders them with those
  tools (chat template, the tools rendered or taught as chat does, the assistant turn
  opened), so the count is the chat request's prompt_tokens.
- /detokenize {"tokens": [int]} -> {"prompt": str} (special tokens kept, as vLLM).
- /abort_request {"rid": str} or {"abort_all": true} -> {"aborted": [rid, ...]}: stops
  the in-flight requests whose id is `rid` or starts with `rid` + "-" (the ids of a
  chat/completions response's choices, `{response id}-{i}`, and of /generate's n
  samples); their streams end with finish_reason "abort". 404 when nothing matched. With
  --api-key set the route needs the key, like every other route: the key's holder is the
  only caller, so the caller's own requests are all requests.

Unknown body fields are ignored with a logged warning, or (``--strict-request-fields``)
a 400 ``unknown_parameter`` naming the first, as on the generation routes. Every 400
names its field (``prompt``, ``messages``, ``rid``, ...).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from radixlm.errors import InvalidRequestError
from radixlm.frontend.errors import APIError, invalid_request, renamed
from radixlm.frontend.protocol import ChatMessage, _Strict, check_supported

#: Longest token list /detokenize takes (a context's worth of a large model).
MAX_DETOKENIZE = 1 << 20


class TokenizeRequest(_Strict):
    """Exactly one of `prompt` and `messages` (checked by `TokenServing.tokenize`)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    # Chat's tools (OpenAI function tools) and choice, with `messages` only.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE)


class AbortRequest(_Strict):
    """SGLang's /abort_request body: one request id, or every request (checked by
    `TokenServing.abort`)."""

    rid: str | None = None
    abort_all: bool = False


class TokenServing:
    """The three routes over a tokenizer manager `tm` and the chat renderer of
    `OpenAIServing` (`chat_ids(messages)`)."""

    def __init__(self, tm, openai):
        self.tm = tm
        self.openai = openai

    def _parse(self, model: type[_Strict], body: bytes) -> Any:
        req = model.model_validate_json(body)
        check_supported(req, strict=self.openai.strict_fields)
        return req

    def tokenize(self, body: bytes) -> dict[str, Any]:
        """Raises pydantic ValidationError / APIError (HTTP 400)."""
        req = self._parse(TokenizeRequest, body)
        if (req.prompt is None) == (req.messages is None):
            param = "prompt" if req.prompt is None else "messages"
            raise invalid_request("give exactly one of 'prompt' and 'messages'", param=param)
        if req.messages == []:
            raise invalid_request("'messages' must not be empty", param="messages")
        if req.messages is None and (req.tools is not None or req.tool_choice is not None):
            param = "tools" if req.tools is not None else "tool_choice"
            raise invalid_request(f"'{param}' needs 'messages'", param=param)
        if req.messages is not None:
            ids = self.openai.chat_ids(req.messages, req.tools, req.tool_choice)
        elif req.add_special_tokens:
            try:
                ids = self.tm.encode(req.prompt)
            except InvalidRequestError as e:
                raise renamed(e, {"prompt": "prompt"}) from None
        else:
            ids = self.tm.tokenizer.encode(req.prompt, add_special_tokens=False)
        return {"tokens": ids, "count": len(ids), "max_model_len": self.tm.context_len}

    def detokenize(self, body: bytes) -> dict[str, Any]:
        """Raises pydantic ValidationError / APIError (HTTP 400) for ids outside the
        vocabulary."""
        req = self._parse(DetokenizeRequest, body)
        vocab = self.tm.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise invalid_request(
                f"token id {bad} is outside the vocabulary [0, {vocab})", param="tokens"
            )
        return {"prompt": self.tm.tokenizer.decode(req.tokens)}

    def abort(self, body: bytes) -> dict[str, Any]:
        """Raises pydantic ValidationError (400), APIError 404 when no request matched."""
        req = self._parse(AbortRequest, body)
        if (req.rid is None) == (not req.abort_all):
            param = "rid" if req.rid is None else "abort_all"
            raise invalid_request("give 'rid' or 'abort_all': true (not both)", param=param)
        aborted = self.tm.abort_matching(None if req.abort_all else req.rid)
        if not aborted and not req.abort_all:
            raise APIError(
                404, f"no running request has the id {req.rid!r}", param="rid", code="not_found"
            )
        return {"aborted": aborted}
