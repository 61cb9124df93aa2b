"""Role markers (the text around each chat message) taken from a tokenizer's chat template.

`from_tokenizer` renders probe conversations with the tokenizer's own template
(`apply_chat_template`) and cuts the begin/end marker of each role out of the result, so a
program's ``with s.user(): ...`` produces exactly the tokens the model was trained on.
The markers are checked by rendering a five-message conversation both ways.

Fallback: when the tokenizer has no chat template, or its template cannot be split into
per-role markers (it rejects a system message, merges roles, or renders differently when
rebuilt from markers), the ChatML markers ``<|im_start|>{role}\\n`` ... ``<|im_end|>\\n``
are used and a warning is logged. Pass an explicit `ChatTemplate` to a backend to
override either.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

_PROBES = {
    "system": "Xq7SystemProbe",
    "user": "Xq7UserProbe",
    "assistant": "Xq7AssistantProbe",
}


@dataclass(frozen=True)
class ChatTemplate:
    """Per-role (begin, end) marker text.

    name: where the markers came from. preamble: text the template writes once before
    the first message (such as a BOS token that is not part of any role marker); it is
    prepended when a role opens on an empty state.
    """

    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    preamble: str = ""
    stop_str: tuple[str, ...] = field(default=())

    def get_prefix_and_suffix(self, role: str) -> tuple[str, str]:
        """(begin, end) markers of `role`. Raises ValueError for an unknown role."""
        try:
            return self.role_prefix_and_suffix[role]
        except KeyError:
            raise ValueError(f"chat template {self.name!r} has no role {role!r}") from None


CHATML = ChatTemplate(
    name="chatml",
    role_prefix_and_suffix={
        role: (f"<|im_start|>{role}\n", "<|im_end|>\n") for role in ("system", "user", "assistant")
    },
    stop_str=("<|im_end|>",),
)

# Chat APIs take structured messages: the text form only separates turns for display.
PLAIN = ChatTemplate(
    name="plain",
    role_prefix_and_suffix={role: ("", "\n") for role in ("system", "user", "assistant")},
)


def _render(tokenizer, roles: list[str], generation_prompt: bool = False) -> str:
    messages = [
        {"role": r, "content": _PROBES[r] if i < 3 else _PROBES[r] + "2"}
        for i, r in enumerate(roles)
    ]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def _split(rendered: str, before: str, probe: str) -> tuple[str, str]:
    """(begin, end) around `probe` in `rendered`, which must extend `before`."""
    if not rendered.startswith(before) or rendered.count(probe) != 1:
        raise ValueError("the template does not render messages one after another")
    rest = rendered[len(before) :]
    begin, _, end = rest.partition(probe)
    return begin, end


def _derive(tokenizer) -> ChatTemplate:
    """Markers from probe renderings; raises ValueError (or the template's own error)."""
    sys_only = _render(tokenizer, ["system"])
    sys_begin, sys_end = _split(sys_only, "", _PROBES["system"])
    two = _render(tokenizer, ["system", "user"])
    user_begin, user_end = _split(two, sys_only, _PROBES["user"])
    three = _render(tokenizer, ["system", "user", "assistant"])
    asst_begin, asst_end = _split(three, two, _PROBES["assistant"])
    preamble = ""
    candidate = user_begin.replace("user", "system")
    if candidate != user_begin and sys_begin.endswith(candidate) and sys_begin != candidate:
        preamble, sys_begin = sys_begin[: -len(candidate)], candidate
    markers = {
        "system": (sys_begin, sys_end),
        "user": (user_begin, user_end),
        "assistant": (asst_begin, asst_end),
    }
    name = getattr(tokenizer, "name_or_path", "") or "tokenizer"
    template = ChatTemplate(f"chat_template:{name}", markers, preamble, _stop_strings(asst_end))
    _check(tokenizer, template)
    return template


def _stop_strings(assistant_end: str) -> tuple[str, ...]:
    marker = assistant_end.strip()
    return (marker,) if marker else ()


def _check(tokenizer, t: ChatTemplate) -> None:
    roles = ["system", "user", "assistant", "user", "assistant"]
    expected = _render(tokenizer, roles)
    built = t.preamble
    for i, role in enumerate(roles):
        begin, end = t.get_prefix_and_suffix(role)
        built += begin + (_PROBES[role] if i < 3 else _PROBES[role] + "2") + end
    if built != expected:
        raise ValueError("markers do not rebuild the template's rendering")
    with_prompt = _render(tokenizer, ["system", "user"], generation_prompt=True)
    without = _render(tokenizer, ["system", "user"])
    if with_prompt != without + t.get_prefix_and_suffix("assistant")[0]:
        raise ValueError("the generation prompt is not the assistant begin marker")


def from_tokenizer(tokenizer) -> ChatTemplate:
    """Role markers of `tokenizer`'s chat template, or CHATML (see the module docstring).

    Args:
        tokenizer: a `transformers` tokenizer (anything with `apply_chat_template` and a
            `chat_template` attribute).
    """
    if not getattr(tokenizer, "chat_template", None):
        logger.info("tokenizer has no chat template; using ChatML role markers")
        return CHATML
    try:
        return _derive(tokenizer)
    except Exception as e:  # noqa: BLE001 - any template failure means "use the fallback"
        logger.warning("cannot split the chat template into role markers (%s); using ChatML", e)
        return CHATML


def for_model(model: str) -> ChatTemplate:
    """Markers for a radixlm model value (alias, HF directory or .gguf) found locally.

    Falls back to CHATML (with a warning) when the model's tokenizer cannot be loaded
    here, e.g. for a server on another machine.
    """
    try:
        from transformers import AutoTokenizer

        from radixlm.runtime import local_hf_dir

        tokenizer = AutoTokenizer.from_pretrained(local_hf_dir(model))
    except Exception as e:  # noqa: BLE001
        logger.warning("cannot load the tokenizer of %r (%s); using ChatML role markers", model, e)
        return CHATML
    return from_tokenizer(tokenizer)
