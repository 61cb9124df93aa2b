"""vLLM / SGLang / OpenAI request extensions mapped onto radixlm's own settings.

* OpenAI routes: `output_settings` turns include_stop_str_in_output (vLLM; radixlm's
  no_stop_trim), skip_special_tokens and spaces_between_special_tokens into
  `SamplingParams` fields; `resolve_tools` handles ``tool_choice`` of type
  ``allowed_tools`` (the tools offered are cut to the listed ones, mode auto / required)
  and refuses ``custom`` tools; `template_kwargs` checks ``chat_template_kwargs``.
* /generate: `sglang_sampling` takes SGLang's sampling_params dict (its null values
  mean the default, ``sampling_seed`` is ``seed``, ``n`` copies per prompt,
  stream_interval / custom_params have no effect here); `check_lora` refuses adapters.

Every refusal is a 400 (`invalid_request`) naming the field.
"""

from __future__ import annotations

from typing import Any

from radixlm.frontend.errors import invalid_request
from radixlm.runtime.sampling.sampler import SamplingParams

# OpenAI / vLLM field -> SamplingParams field.
_OUTPUT_FIELDS = {
    "include_stop_str_in_output": "no_stop_trim",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
}

# SGLang sampling parameters accepted without effect: stream_interval sets how often
# SGLang streams (radixlm streams every step); custom_params feed a custom logit
# processor, which radixlm has not.
_SGLANG_NO_EFFECT = ("stream_interval", "custom_params")

#: Most copies per prompt a /generate request may ask for (as OpenAI's ``n``).
MAX_N = 128

# apply_chat_template's own parameters: chat_template_kwargs may not set them.
_TEMPLATE_RESERVED = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def output_settings(req: Any) -> dict[str, bool]:
    """The SamplingParams fields set by the request's output-text extensions."""
    return {
        ours: getattr(req, name)
        for name, ours in _OUTPUT_FIELDS.items()
        if getattr(req, name) is not None
    }


def template_kwargs(value: dict[str, Any] | None) -> dict[str, Any]:
    """``chat_template_kwargs`` as extra template variables. Raises a 400 for a key that
    is one of apply_chat_template's own parameters (tokenize, tools, ...)."""
    for key in value or {}:
        if key in _TEMPLATE_RESERVED:
            raise invalid_request(
                f"chat_template_kwargs may not set {key!r} (a chat template rendering "
                "option, not a template variable)",
                param=f"chat_template_kwargs.{key}",
                code="invalid_value",
            )
    return dict(value or {})


def resolve_tools(
    tools: list[Any] | None, choice: str | dict | None
) -> tuple[list[Any] | None, str | dict | None]:
    """(tools, tool_choice) with ``allowed_tools`` resolved and custom tools refused.

    ``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools":
    [{"type": "function", "function": {"name"}} | {"type": "function", "name"}]}}``
    (OpenAI) keeps only the listed tools and becomes ``mode``. Raises a 400 for a
    ``custom`` tool (free-form input, not supported) or a bad allowed_tools value.
    """
    for i, tool in enumerate(tools or []):
        if isinstance(tool, dict) and tool.get("type") == "custom":
            raise invalid_request(
                "custom tools (type 'custom', free-form text input) are not supported; "
                "declare a 'function' tool with a JSON schema instead",
                param=f"tools.{i}.type",
                code="unsupported_parameter",
            )
    if not (isinstance(choice, dict) and choice.get("type") == "allowed_tools"):
        return tools, choice
    spec = choice.get("allowed_tools")
    mode = spec.get("mode") if isinstance(spec, dict) else None
    listed = spec.get("tools") if isinstance(spec, dict) else None
    if mode not in ("auto", "required") or not isinstance(listed, list) or not listed:
        raise invalid_request(
            "'allowed_tools' needs a 'mode' of 'auto' or 'required' and a non-empty 'tools' list",
            param="tool_choice.allowed_tools",
        )
    names = {_tool_name(i, t) for i, t in enumerate(listed)}
    kept = [t for t in tools or [] if _function_name(t) in names]
    missing = names - {_function_name(t) for t in kept}
    if missing:
        raise invalid_request(
            f"allowed_tools names tools not in 'tools': {', '.join(sorted(missing))}",
            param="tool_choice.allowed_tools.tools",
        )
    return kept, mode


def _tool_name(index: int, ref: Any) -> str:
    fn = ref.get("function") if isinstance(ref, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else (ref or {}).get("name")
    if not isinstance(ref, dict) or ref.get("type") != "function" or not isinstance(name, str):
        raise invalid_request(
            'an allowed tool must be {"type": "function", "function": {"name": str}}',
            param=f"tool_choice.allowed_tools.tools.{index}",
        )
    return name


def _function_name(tool: Any) -> str | None:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


def sglang_sampling(
    value: dict[str, Any] | None, strict: bool
) -> tuple[dict[str, Any] | None, int, list[str]]:
    """One SGLang sampling_params dict as radixlm's: (SamplingParams dict, n, unknown key
    paths ignored). Nulls mean the default; a single stop string is a list. Unknown keys
    are dropped unless `strict` (then `SamplingParams.from_any` refuses them). Raises a
    400 for a bad ``n`` or a non-empty ``stop_regex``."""
    if value is None:
        return None, 1, []
    out = {k: v for k, v in value.items() if v is not None and k not in _SGLANG_NO_EFFECT}
    n = out.pop("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise invalid_request(
            f"sampling_params.n must be an int in [1, {MAX_N}], got {n!r}",
            param="sampling_params",
            code="invalid_value",
        )
    if out.pop("stop_regex", None):
        raise invalid_request(
            "stop_regex is not supported; use 'stop' strings",
            param="sampling_params",
            code="unsupported_parameter",
        )
    seed = out.pop("sampling_seed", None)  # SGLang's name; an explicit seed wins
    if seed is not None:
        out.setdefault("seed", seed)
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    unknown = [k for k in out if k not in SamplingParams.__struct_fields__]
    if not strict:
        for key in unknown:
            del out[key]
    return out, n, [f"sampling_params.{k}" for k in unknown]


def check_lora(lora_path: Any) -> None:
    """Raise a 400 unless ``lora_path`` is null (or a list of nulls)."""
    paths = lora_path if isinstance(lora_path, list) else [lora_path]
    if any(p is not None for p in paths):
        raise invalid_request(
            "LoRA adapters are not supported", param="lora_path", code="unsupported_parameter"
        )
