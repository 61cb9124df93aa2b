"""Chat messages -> prompt token ids through the tokenizer's chat template.

Messages are normalised first: text content parts are joined with newlines (other part
types are refused; a part's ``cache_control`` hint has no effect), ``developer`` becomes
``system``, assistant ``tool_calls`` are checked (``{"id", "type": "function",
"function": {"name", "arguments": str | object}}``, an object is serialized to JSON as
vLLM does), an assistant's ``reasoning_content`` is passed to the template (Qwen3's
renders it), and every message needs its content except an assistant turn that carries
tool_calls or a refusal (as the OpenAI API requires). Tools are rendered by
`tool_prompt.render_chat`; ``chat_template_kwargs`` (e.g. ``enable_thinking``) are extra
template variables.
The template writes BOS itself when the model has one; no special tokens are added on
top (no double BOS). Special-token text in the client's strings is tokenized as text
unless the server allows it (`ChatPrompts`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from radixlm.frontend.errors import invalid_request
from radixlm.frontend.protocol import ChatMessage
from radixlm.frontend.special_text import SpecialText
from radixlm.frontend.tool_prompt import ToolSetup, render_chat, template_knows_tools


def normalise_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """{role, content (str), tool_calls?, tool_call_id?} dicts. Raises APIError (400)."""
    return [_message(i, m) for i, m in enumerate(messages)]


def rendered_chars(
    messages: list[dict[str, Any]], setup: ToolSetup, variables: dict[str, Any] | None = None
) -> int:
    """Characters of text the template will render (contents, reasoning, call arguments,
    tools, template variables): a bound checked before tokenizing."""
    n = sum(len(m["content"]) + len(m.get("reasoning_content", "")) for m in messages)
    n += sum(len(c["function"]["arguments"]) for m in messages for c in m.get("tool_calls", ()))
    n += len(json.dumps(variables, default=str)) if variables else 0
    return n + (len(json.dumps(setup.tools)) if setup.active else 0)


class ChatPrompts:
    """Token ids of chats rendered by one tokenizer's chat template.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        special_in_content: parse special-token text inside the client's strings (message
            contents, tool calls, tool definitions) as special tokens, as the template's
            own markers are (``--allow-special-tokens-in-content``, for trusted clients).
            Off: that text is tokenized as ordinary text (`special_text.SpecialText`).
    """

    def __init__(self, tokenizer, special_in_content: bool = False):
        self.tokenizer = tokenizer
        self._guard = not special_in_content

    @functools.cached_property
    def _special(self) -> SpecialText | None:
        """The tokenizer's special strings, read on the first chat (None: not guarded)."""
        return SpecialText(self.tokenizer) if self._guard else None

    def ids(
        self,
        messages: list[dict[str, Any]],
        setup: ToolSetup,
        variables: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the rendered chat with the assistant turn opened.

        Args:
            messages: `normalise_messages` output. setup: the request's tools.
            variables: extra template variables (chat_template_kwargs; no
                apply_chat_template parameter, see `request_compat.template_kwargs`);
                their strings are client text like the messages.
        Raises APIError (400) when the template refuses the messages.
        """
        variables = variables or {}
        special = self._special
        client = (messages, setup.tools, variables)
        if special is None or not any(special.found(v) for v in client):
            return list(self._apply(messages, setup, variables, tokenize=True))
        key = special.new_key()
        masked = ToolSetup(special.masked(setup.tools, key), setup.forced, setup.parallel)
        rendered = self._apply(
            special.masked(messages, key), masked, special.masked(variables, key), False
        )
        return special.encode(rendered, key)

    def _apply(
        self,
        messages: list[dict[str, Any]],
        setup: ToolSetup,
        variables: dict[str, Any],
        tokenize: bool,
    ):
        rendered, extra = render_chat(messages, setup, template_knows_tools(self.tokenizer))
        try:
            return self.tokenizer.apply_chat_template(
                rendered,
                add_generation_prompt=True,
                tokenize=tokenize,
                return_dict=False,
                **{**variables, **extra},
            )
        except Exception as e:  # jinja errors: the template refused these messages
            raise invalid_request(f"the chat template failed: {e}", param="messages") from None


def _message(index: int, m: ChatMessage) -> dict[str, Any]:
    if m.function_call or m.role == "function":
        raise invalid_request(
            "legacy function messages are not supported; use tool_calls and role 'tool'",
            param=f"messages.{index}",
            code="unsupported_parameter",
        )
    if m.content is None and not (m.role == "assistant" and (m.tool_calls or m.refusal)):
        need = "'content' or 'tool_calls'" if m.role == "assistant" else "'content'"
        raise invalid_request(f"a {m.role} message needs {need}", param=f"messages.{index}.content")
    out: dict[str, Any] = {
        "role": "system" if m.role == "developer" else m.role,
        "content": _text(index, m),
    }
    if m.tool_calls:
        if m.role != "assistant":
            raise invalid_request(
                "only assistant messages carry tool_calls", param=f"messages.{index}.tool_calls"
            )
        out["tool_calls"] = [_tool_call(index, j, c) for j, c in enumerate(m.tool_calls)]
    if m.role == "tool" and m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.role == "assistant" and m.reasoning_content is not None:
        out["reasoning_content"] = m.reasoning_content
    return out


def _text(index: int, m: ChatMessage) -> str:
    if not isinstance(m.content, list):
        return m.content or ""
    texts = []
    for j, part in enumerate(m.content):
        if part.type != "text":
            raise invalid_request(
                f"content parts of type {part.type!r} are not supported (text only)",
                param=f"messages.{index}.content.{j}",
                code="unsupported_parameter",
            )
        if part.text is None:
            raise invalid_request(
                "a content part of type 'text' needs a 'text' string",
                param=f"messages.{index}.content.{j}.text",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _tool_call(index: int, j: int, call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function")
    if (
        call.get("type", "function") != "function"
        or not isinstance(fn, dict)
        or not isinstance(fn.get("name"), str)
        or not isinstance(fn.get("arguments"), str | dict)
    ):
        raise invalid_request(
            'a tool call must be {"id", "type": "function", "function": {"name": str, '
            '"arguments": str | object}}',
            param=f"messages.{index}.tool_calls.{j}",
        )
    arguments = fn["arguments"]
    if isinstance(arguments, dict):  # some clients send the parsed object (vLLM takes it)
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": fn["name"], "arguments": arguments},
    }
