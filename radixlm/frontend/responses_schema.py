"""Documented response bodies of the Responses API routes, for /openapi.json.

Like response_types.py these models only describe what the routes send (the bodies are
built as dicts in responses_output.py and serving_responses.py) and forbid extra fields,
so the schema-conformance fuzz test catches a field the code sends but the spec does not
describe. Shapes: the OpenAI API reference, "The response object" and "Delete a model
response". Token counts are in tokens.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OutputText(_Body):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class MessageItem(_Body):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: ItemStatus
    content: list[OutputText]


class FunctionCallItem(_Body):
    """arguments: JSON text (an ``incomplete`` call's is cut short)."""

    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


class ReasoningText(_Body):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Body):
    """The model's reasoning (``--reasoning-parser``); summary is always empty."""

    id: str
    type: Literal["reasoning"]
    summary: list[Any]
    status: ItemStatus
    content: list[ReasoningText]


class InputTokensDetails(_Body):
    cached_tokens: int


class OutputTokensDetails(_Body):
    reasoning_tokens: int


class ResponseUsage(_Body):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(_Body):
    reason: Literal["max_output_tokens"]


class ResponseObject(_Body):
    """POST /v1/responses (non-streamed; streamed, the ``response`` of its events) and
    GET /v1/responses/{id}."""

    id: str
    object: Literal["response"]
    created_at: int
    status: ItemStatus
    error: None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[ReasoningItem | MessageItem | FunctionCallItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any]
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]


class ResponseDeleted(_Body):
    """DELETE /v1/responses/{id}."""

    id: str
    object: Literal["response.deleted"]
    deleted: Literal[True]
