"""Request types of the HTTP API: OpenAI completions and chat completions, native /generate.

Known fields are typed strictly (pydantic strict mode): ``"3"`` is not an integer,
``true`` is not a number. Unknown fields (at any depth: a message, a content part,
stream_options) are accepted and ignored with one warning per request naming them, as
vLLM and SGLang do; with ``--strict-request-fields`` they are refused (`check_supported`).
Every parse error becomes an HTTP 400 with an OpenAI error body (see errors.py).

OpenAI fields radixlm does not implement yet are declared with their OpenAI types, so a
client sending the default (no-op) value works; `NOT_YET_SUPPORTED` lists the accepted
values and `check_supported` refuses any other value with a message naming the field.
A later feature implements a field by removing its entry and mapping it in serving code.
Real OpenAI fields that do not change radixlm's output (`IGNORED`: audio output,
predicted outputs, reasoning effort, web search, storage and billing options, ...) are
accepted and ignored; `check_supported` logs one warning per request naming them.
vLLM / SGLang extensions that change the output (include_stop_str_in_output,
skip_special_tokens, spaces_between_special_tokens, cache_salt, chat_template_kwargs) are
mapped in serving code (`request_compat.py`); the scheduling extensions (priority,
slo_ttft_ms, slo_tpot_ms) by `sched_options`.

Response bodies are plain dicts built in `serving_openai.py` / `serving_native.py`; their
documented schemas (for /openapi.json) are in `response_types.py`.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixlm.frontend.errors import invalid_request
from radixlm.runtime.sampling.sampler import MAX_REQUEST_INT, MAX_TOP_K
from radixlm.runtime.sched.request import SchedOptions

logger = logging.getLogger(__name__)

# Bounds of the int fields (the runtime's: SamplingParams / LogprobOptions.validate check
# them again). Larger counts are nonsense for any model, would overflow int32 tables, and
# an int of 2**64 or more cannot cross the process boundary (msgpack).
_MAX_TOKENS_LIMIT = MAX_REQUEST_INT
_MAX_SEED = 2**63 - 1

# field -> values that mean "feature off". Any other value is refused (HTTP 400).
NOT_YET_SUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
}

# Accepted and ignored (one warning per request): they do not change radixlm's output.
IGNORED: tuple[str, ...] = (
    "suffix",
    "user",
    "store",
    "metadata",
    "service_tier",
    "audio",
    "prediction",
    "modalities",
    "reasoning_effort",
    "web_search_options",
    "verbosity",
    # Caching hints of OpenAI: prefix caching is automatic (cache_salt is the field that
    # changes it).
    "prompt_cache_key",
    "safety_identifier",
    "stream_options.include_obfuscation",
)


class _Strict(BaseModel):
    """Strictly typed; unknown fields are kept in `model_extra` for `check_supported`."""

    model_config = ConfigDict(extra="allow", strict=True)


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of the fields `model` and the models inside it (lists included) hold
    that no model declares, in request order (e.g. ``messages.0.foo``)."""
    found = [f"{prefix}{name}" for name in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, BaseModel):
                where = f"{prefix}{name}." if i is None else f"{prefix}{name}.{i}."
                found += unknown_fields(item, where)
    return found


def _set(req: BaseModel, path: str) -> bool:
    """Whether the (dotted) field `path` of `req` is set to a value other than None."""
    value: Any = req
    for part in path.split("."):
        value = getattr(value, part, None)
    return value is not None


def check_supported(req: BaseModel, strict: bool = False, unknown: list[str] = ()) -> None:
    """Raise a 400 APIError naming the first field set to a value radixlm cannot honour yet,
    or (`strict`) the first unknown field (code unknown_parameter); else log one warning
    naming the `IGNORED` fields the request sets and its unknown fields, those of
    `unknown_fields` plus `unknown` (found by the caller, e.g. in a dict field)."""
    extra = [*unknown_fields(req), *unknown]
    if strict and extra:
        raise invalid_request(
            f"Unrecognized request argument supplied: {extra[0]}",
            param=extra[0],
            code="unknown_parameter",
        )
    ignored = [name for name in IGNORED if _set(req, name)]
    if ignored or extra:
        logger.warning("ignoring request fields: %s", ", ".join([*ignored, *extra]))
    for name, allowed in NOT_YET_SUPPORTED.items():
        value = getattr(req, name, None)
        if value is None:
            continue
        if isinstance(value, BaseModel):
            value = value.model_dump(exclude_none=True)
        if any(_same(value, ok) for ok in allowed):
            continue
        shown = ", ".join(repr(v) for v in allowed if v is not None)
        raise invalid_request(
            f"'{name}' = {value!r} is not supported yet by radixlm (accepted: {shown or 'unset'})",
            param=name,
            code="unsupported_parameter",
        )


def _same(value: Any, ok: Any) -> bool:
    """Equal, and not a bool standing in for a number (``0 == False`` in Python)."""
    return ok is not None and value == ok and isinstance(value, bool) == isinstance(ok, bool)


class StreamOptions(_Strict):
    """include_usage: send a last chunk with empty choices and the request's usage."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None
    include_obfuscation: bool | None = None  # OpenAI's padding field; never added here


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class SamplingFields(_Strict):
    """Fields shared by completions and chat completions (OpenAI names and ranges)."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=_MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = Field(None, ge=1, le=128)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    # Extensions (SGLang / vLLM names).
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K)  # 0 refused by SamplingParams
    min_p: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    repetition_penalty: float | None = Field(None, gt=0)
    # Structured output (frontend/structured.py): OpenAI's response_format, on completions
    # too (as vLLM and SGLang accept it), and the regex / ebnf extensions (SGLang names).
    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    min_tokens: int | None = Field(None, ge=0, le=_MAX_TOKENS_LIMIT)
    # Output-text extensions (vLLM names; request_compat.py maps them).
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    # Prefix-cache namespace (vLLM): requests share cached prefixes only with the same salt.
    cache_salt: str | None = Field(None, min_length=1)
    # Scheduling extensions (`SchedFields`): priority, slo_ttft_ms, slo_tpot_ms.
    priority: int | None = None
    slo_ttft_ms: float | None = Field(None, gt=0)
    slo_tpot_ms: float | None = Field(None, gt=0)
    # Accepted and ignored (`IGNORED`).
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class CompletionRequest(SamplingFields):
    """POST /v1/completions. prompt: a string, strings, token ids, or lists of token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 scores the prompt (with echo and logprobs); refused without echo.
    max_tokens: int | None = Field(None, ge=0, le=_MAX_TOKENS_LIMIT)
    best_of: int | None = Field(None, ge=1, le=128)
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None


class TextPart(_Strict):
    """A content part; only ``{"type": "text"}`` parts are served (checked in serving)."""

    type: str
    text: str | None = None
    image_url: dict[str, Any] | None = None
    input_audio: dict[str, Any] | None = None
    file: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None  # Anthropic-style cache hint; no effect


class ChatMessage(_Strict):
    """One chat turn. Fields the OpenAI SDK echoes back from responses are accepted."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    # An earlier turn's reasoning (vLLM / SGLang); templates that render it (Qwen3) get it.
    reasoning_content: str | None = None


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[str] | None = None
    reasoning_effort: str | None = None
    web_search_options: dict[str, Any] | None = None
    # Accepted and ignored: they do not change the output.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    verbosity: str | None = None
    separate_reasoning: bool | None = None
    # Extra variables for the chat template (vLLM / SGLang), e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None


class SessionParamsModel(_Strict):
    """SGLang's ``session_params`` of /generate (serving_sessions.py, docs/agents.md):
    the session `id`, the earlier request `rid` to continue (None: a new branch), `offset`
    (keep that many tokens of its sequence; None or 0: all), `replace` (drop the other
    branches), `drop_previous_output` (continue from its prompt only)."""

    id: str = Field(min_length=1)
    rid: str | None = None
    offset: int | None = Field(None, ge=0, le=_MAX_TOKENS_LIMIT)
    replace: bool | None = None
    drop_previous_output: bool | None = None


class GenerateRequest(_Strict):
    """POST /generate (SGLang's native route).

    Exactly one of `text` (a string or a batch of strings) and `input_ids` (token ids or a
    batch of them). `sampling_params` uses SGLang's names (max_new_tokens, temperature,
    top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, frequency_penalty,
    presence_penalty, repetition_penalty, logit_bias, min_new_tokens, no_stop_trim, and one
    grammar of json_schema, regex, ebnf, structural_tag): one dict for all prompts or a list
    with one per prompt; its values are checked by `SamplingParams.from_any`. Logprobs:
    return_logprob, logprob_start_len (-1 default: no prompt logprobs), top_logprobs_num,
    return_text_in_logprobs, token_ids_logprob (ids whose logprobs every returned
    position also gives; one list for every prompt of a batch) (SGLang's contract).
    SGLang's other sampling parameters are mapped by `request_compat.sglang_sampling` (n,
    sampling_seed, skip_special_tokens, ...).
    lora_path: only null (no adapters here). cache_salt: as on the OpenAI routes.
    session_params: a turn of a session (`SessionParamsModel`; one prompt, n = 1).
    priority, slo_ttft_ms, slo_tpot_ms: as on the OpenAI routes (`sched_options`).
    """

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = Field(None, ge=-1, le=_MAX_TOKENS_LIMIT)
    top_logprobs_num: int | None = Field(None, ge=0, le=_MAX_TOKENS_LIMIT)
    return_text_in_logprobs: bool | None = None
    token_ids_logprob: list[int] | None = Field(None, max_length=_MAX_TOKENS_LIMIT)
    lora_path: str | list[str | None] | None = None
    cache_salt: str | None = Field(None, min_length=1)
    session_params: SessionParamsModel | None = None
    # Prefill/decode disaggregation (SGLang's names; set by the router, disagg_fields.py).
    bootstrap_host: str | None = None
    bootstrap_port: int | None = Field(None, ge=1, le=65535)
    bootstrap_room: int | None = Field(None, ge=0, le=2**63 - 1)
    priority: int | None = None
    slo_ttft_ms: float | None = Field(None, gt=0)
    slo_tpot_ms: float | None = Field(None, gt=0)


def sched_options(req: BaseModel) -> SchedOptions:
    """A request's scheduling extensions (same names on /v1/completions,
    /v1/chat/completions and /generate): ``priority`` (integer, higher = admitted first
    and retracted last; default 0) and ``slo_ttft_ms`` / ``slo_tpot_ms`` (its own SLO
    targets, ms > 0; default: the server's --slo-ttft-ms / --slo-tpot-ms)."""
    return SchedOptions(
        priority=getattr(req, "priority", None) or 0,
        slo_ttft_ms=getattr(req, "slo_ttft_ms", None),
        slo_tpot_ms=getattr(req, "slo_tpot_ms", None),
    )
