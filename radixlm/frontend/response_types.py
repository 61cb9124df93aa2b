"""Documented response bodies of the HTTP API, for /openapi.json (see openapi.py).

These pydantic models only describe what the routes send: the bodies themselves are
built as dicts in serving_openai.py (formats.py), serving_native.py and app.py and are
never passed through these models, so a model cannot change a response. Models forbid
extra fields (``additionalProperties: false``) so a schema-conformance check catches
a field the code sends but the spec does not describe. Token counts are in tokens,
logprobs are natural-log probabilities (null where the runtime has none, e.g. -inf).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, RootModel


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Body):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Body):
    """Every 4xx / 5xx JSON body (frontend/errors.py)."""

    error: ErrorDetail


class PromptTokensDetails(_Body):
    cached_tokens: int


class UsageInfo(_Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(_Body):
    """One entry per token (echoed prompt tokens first); null for a prompt's first token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float | None] | None]
    text_offset: list[int]


class CompletionChoice(_Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"]


class CompletionResponse(_Body):
    """POST /v1/completions without ``stream``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class TopLogprob(_Body):
    token: str
    logprob: float | None
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Body):
    content: list[TokenLogprob]
    refusal: None


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text


class ToolCall(_Body):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Body):
    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: list[ToolCall] | None = None  # only when the output parsed as calls


class ChatChoice(_Body):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"]


class ChatCompletionResponse(_Body):
    """POST /v1/chat/completions without ``stream``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class GenerateFinishReason(_Body):
    """SGLang's finish_reason: matched (stop: the token id or stop string, null for EOS),
    length (length: completion tokens)."""

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None


# [logprob, token id, token text (null unless return_text_in_logprobs)]
LogprobEntry = tuple[float | None, int, str | None]


class GenerateMetaInfo(_Body):
    id: str
    finish_reason: GenerateFinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    spec_accept_length: float | None = None  # speculative decoding only
    # With return_logprob (runtime/server/meta_info.py):
    input_token_logprobs: list[LogprobEntry] | None = None
    output_token_logprobs: list[LogprobEntry] | None = None
    input_top_logprobs: list[list[LogprobEntry] | None] | None = None
    output_top_logprobs: list[list[LogprobEntry] | None] | None = None


class GenerateResult(_Body):
    text: str
    output_ids: list[int]
    meta_info: GenerateMetaInfo


class GenerateResponse(RootModel[GenerateResult | list[GenerateResult]]):
    """POST /generate without ``stream``: one result, or a list for a batch of prompts."""


class ModelCard(_Body):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int


class ModelList(_Body):
    object: Literal["list"]
    data: list[ModelCard]


class ModelInfo(_Body):
    """GET /get_model_info."""

    model_path: str
    served_model_name: str
    is_generation: bool
    context_length: int
    vocab_size: int


class ServerInfo(BaseModel):
    """GET /get_server_info: the server's settings (``args``, api_key redacted), KV
    capacity and pool counters (tokens), scheduler counters; open-ended."""

    model_config = ConfigDict(extra="allow")

    served_model_name: str
    args: dict[str, Any]


class FlushCacheResponse(_Body):
    message: str


class TokenizeResponse(_Body):
    """POST /tokenize."""

    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(_Body):
    """POST /detokenize."""

    prompt: str


class AbortResponse(_Body):
    """POST /abort_request: the ids of the requests asked to stop."""

    aborted: list[str]
