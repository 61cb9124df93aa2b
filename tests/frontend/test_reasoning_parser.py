"""Reasoning parser: ``<think>...</think>`` split whole and streamed, in the chat format
together with tool calls (no server)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from radixlm.frontend.reasoning import (
    ReasoningParser,
    Split,
    prompt_opens_think,
    request_reasoning,
)
from radixlm.frontend.tool_calls import ToolChatFormat
from radixlm.frontend.tool_parsers import make_tool_parser
from radixlm.runtime.sched.finish import FinishReason

# (mode, prompt opens <think>, output, reasoning, content)
CASES = [
    (
        "qwen3",
        False,
        "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.",
        "Let me see: 2+2.",
        "It is 4.",
    ),
    ("qwen3", False, "It is 4, no thinking.", "", "It is 4, no thinking."),
    ("qwen3", False, "  <think>a<b</think>c", "a<b", "c"),
    ("qwen3", True, "Hmm.</think>It is 4.", "Hmm.", "It is 4."),
    ("qwen3", False, "<think>\ncut while thinki", "cut while thinki", ""),
    ("deepseek-r1", False, "Hmm, 2+2.\n</think>\n\nIt is 4.", "Hmm, 2+2.", "It is 4."),
    ("deepseek-r1", False, "<think>\nHmm.</think>4", "Hmm.", "4"),
    ("deepseek-r1", False, "cut while thinking", "cut while thinking", ""),
    ("deepseek-r1", False, "", "", ""),
]


def _streamed(parser: ReasoningParser, text: str, rng: random.Random) -> Split:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 6))) if text else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])] or [""]
    stream = parser.stream()
    out = [stream.feed(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    return Split("".join(o.reasoning for o in out), "".join(o.content for o in out))


@pytest.mark.parametrize("mode, opens, text, reasoning, content", CASES)
def test_split_whole_and_streamed(mode, opens, text, reasoning, content):
    parser = ReasoningParser(mode, opens)
    assert parser.split(text) == (reasoning, content)
    for seed in range(6):
        assert _streamed(parser, text, random.Random(seed)) == (reasoning, content)
    one = parser.stream()
    chars = [one.feed(ch) for ch in text] + [one.feed("", final=True)]
    assert "".join(c.reasoning for c in chars) == reasoning
    assert "".join(c.content for c in chars) == content
    assert _no_think_tags(chars)


def _no_think_tags(pieces: list[Split]) -> bool:
    joined = "".join(p.reasoning + p.content for p in pieces)
    return "<think>" not in joined and "</think>" not in joined


def test_prompt_opens_think():
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_think("<|im_start|>assistant\n")


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        ReasoningParser("o1")


def test_flag_values_match():
    from radixlm.config import ServerArgs
    from radixlm.frontend.reasoning import REASONING_PARSERS

    field = ServerArgs.__dataclass_fields__["reasoning_parser"]
    assert field.metadata["choices"] == ["none", *REASONING_PARSERS]


THOUGHT_AND_CALL = (
    "<think>The user wants weather.</think>\n"
    'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


def test_chat_format_reasoning_then_tool_calls():
    fmt = ToolChatFormat(
        "chatcmpl-1",
        0,
        "m",
        tool_parser=make_tool_parser("hermes"),
        reasoning=ReasoningParser("qwen3"),
    )
    full = fmt.full_choice(0, {"text": THOUGHT_AND_CALL, "finish_reason": FinishReason.STOP})
    message = full["message"]
    assert message["reasoning_content"] == "The user wants weather."
    assert message["content"] == "Checking."
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert full["finish_reason"] == "tool_calls"
    chunks = []
    for i in range(0, len(THOUGHT_AND_CALL), 3):
        last = i + 3 >= len(THOUGHT_AND_CALL)
        chunk = {"text": THOUGHT_AND_CALL[i : i + 3], "finish_reason": "stop" if last else None}
        chunks += [c["choices"][0] for c in fmt.deltas(0, chunk, False)]
    deltas = [c["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user wants weather."
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    frags = [f for d in deltas for f in d.get("tool_calls", [])]
    assert "".join(f["function"]["arguments"] for f in frags) == '{"city": "Paris"}'
    assert chunks[-1]["finish_reason"] == "tool_calls"


def test_chat_format_reasoning_only_cut_in_thought():
    fmt = ToolChatFormat("chatcmpl-1", 0, "m", tool_parser=None, reasoning=ReasoningParser("qwen3"))
    full = fmt.full_choice(0, {"text": "<think>still going", "finish_reason": FinishReason.LENGTH})
    assert full["message"]["reasoning_content"] == "still going"
    assert full["message"]["content"] is None and full["finish_reason"] == "length"
    plain = fmt.full_choice(1, {"text": "Just 4.", "finish_reason": FinishReason.STOP})
    assert plain["message"]["reasoning_content"] is None
    assert plain["message"]["content"] == "Just 4." and plain["finish_reason"] == "stop"


def test_request_reasoning(tokenizer):
    """--reasoning-parser applies unless the request sets separate_reasoning: false; the
    prompt's opened <think> puts the output inside the reasoning."""
    plain = tokenizer.encode("<|im_start|>assistant\n")
    opened = tokenizer.encode("<|im_start|>assistant\n<think>\n")
    keep = SimpleNamespace(separate_reasoning=False)
    assert request_reasoning("qwen3", keep, tokenizer, plain) is None
    assert request_reasoning("none", SimpleNamespace(), tokenizer, plain) is None
    split = request_reasoning("qwen3", SimpleNamespace(), tokenizer, plain).split
    assert split("a</think>b") == ("", "a</think>b")
    split = request_reasoning("qwen3", SimpleNamespace(), tokenizer, opened).split
    assert split("a</think>b") == ("a", "b")
