"""Reasoning parser (``--reasoning-parser``): ``<think>...</think>`` -> ``reasoning_content``.

Modes (SGLang's and vLLM's reasoning parsers of the same names):

* ``deepseek-r1``: the chat template opens ``<think>`` in the prompt, so the output
  starts inside the reasoning: the text before ``</think>`` is reasoning (an opening
  ``<think>`` the model writes again is dropped), the rest is content.
* ``qwen3``: the reasoning is the ``<think>...</think>`` block the output starts with;
  an output without one is all content. When the prompt itself ends with ``<think>``
  (templates that open it, e.g. Qwen3 thinking models), the output starts inside the
  reasoning as with ``deepseek-r1``.

An output cut inside the reasoning (no ``</think>``) is all reasoning. Reasoning is
stripped of surrounding whitespace, content after ``</think>`` of leading whitespace.
`ReasoningStream` gives the same split piece by piece: what it has sent is always a
prefix of the final reasoning / content.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from radixlm.frontend.tool_parsers.base import held_back

THINK_START = "<think>"
THINK_END = "</think>"
REASONING_PARSERS = ("deepseek-r1", "qwen3")


class Split(NamedTuple):
    """reasoning and content text of an output (either may be empty)."""

    reasoning: str
    content: str


class ReasoningParser:
    """Splits one output. mode: one of `REASONING_PARSERS`; in_reasoning: the prompt
    opened ``<think>`` (see `prompt_opens_think`). Raises ValueError for another mode."""

    def __init__(self, mode: str, in_reasoning: bool = False):
        if mode not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {mode!r}; use {REASONING_PARSERS}")
        self.forced = mode == "deepseek-r1" or in_reasoning

    def scan(self, text: str, final: bool) -> Split:
        """The split of `text` so far; `final`: nothing more comes (nothing held back)."""
        body = text.lstrip()
        if not final and THINK_START.startswith(body):
            return Split("", "")  # may still be an opening <think>
        if body.startswith(THINK_START):
            body = body[len(THINK_START) :]
        elif not self.forced:
            return Split("", text)
        end = body.find(THINK_END)
        if end < 0:
            keep = len(body) if final else len(body) - held_back(body, (THINK_END,))
            return Split(body[:keep].strip(), "")
        return Split(body[:end].strip(), body[end + len(THINK_END) :].lstrip())

    def split(self, text: str) -> Split:
        """The reasoning and content of a finished output."""
        return self.scan(text, final=True)

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


class ReasoningStream:
    """Text deltas -> (reasoning piece, content piece) pairs."""

    def __init__(self, parser: ReasoningParser):
        self.parser = parser
        self.text = ""
        self.sent = Split("", "")

    def feed(self, delta: str, final: bool = False) -> Split:
        """Add a delta (`final`: it is the last); returns the new pieces."""
        self.text += delta
        now = self.parser.scan(self.text, final)
        out = Split(
            now.reasoning[len(self.sent.reasoning) :], now.content[len(self.sent.content) :]
        )
        self.sent = Split(
            max(now.reasoning, self.sent.reasoning, key=len),
            max(now.content, self.sent.content, key=len),
        )
        return out


def prompt_opens_think(prompt_tail: str) -> bool:
    """Whether a prompt's last text (a few tokens decoded) leaves ``<think>`` open."""
    return prompt_tail.rstrip().endswith(THINK_START)


def request_reasoning(
    mode: str, req: Any, tokenizer: Any, ids: list[int]
) -> ReasoningParser | None:
    """The reasoning parser of one chat request, or None.

    Args:
        mode: ``--reasoning-parser`` (``none`` or one of `REASONING_PARSERS`). req: the
            request; its ``separate_reasoning`` false (vLLM / SGLang's field) keeps the
            reasoning in content. tokenizer, ids: the rendered prompt, whose end tells
            whether the output starts inside ``<think>``.
    """
    if mode == "none" or getattr(req, "separate_reasoning", True) is False:
        return None
    return ReasoningParser(mode, prompt_opens_think(tokenizer.decode(ids[-4:])))
