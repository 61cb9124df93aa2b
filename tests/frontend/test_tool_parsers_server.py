"""Tool-call and reasoning parsers end to end with the bundled model: forced calls cut by
max_tokens, and ``--reasoning-parser`` filling ``reasoning_content``."""

from __future__ import annotations

import json

import openai
import pytest

from radixlm.frontend.tool_prompt import format_call

from .conftest import MODEL, running_server
from .test_tools_server import QUESTION, TOOLS, _chat, _check_call


def _stream(client, **kw) -> tuple[str, list, str]:
    """(joined content, tool-call fragments, finish_reason) of a streamed chat."""
    chunks = [c for c in _chat(client, QUESTION, stream=True, **kw) if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    frags = [f for c in chunks for f in (c.choices[0].delta.tool_calls or [])]
    return content, frags, chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("max_tokens", [2, 8, 20])
def test_forced_call_cut_by_max_tokens(client, max_tokens):
    """The only call is cut: finish_reason length, no call, no markup in content."""
    choice = _chat(client, QUESTION, tool_choice="required", max_tokens=max_tokens).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None and choice.message.tool_calls is None
    content, frags, reason = _stream(client, tool_choice="required", max_tokens=max_tokens)
    assert reason == "length" and content == ""
    # A call whose name was already sent stays started (fragments are not taken back).
    assert all(f.index == 0 for f in frags)


def test_parallel_calls_cut_keep_the_complete_ones(client, tokenizer):
    """Cut inside the second call: the first one is returned whole, the second dropped."""
    kw = {"tool_choice": "required", "parallel_tool_calls": True}
    full = _chat(client, QUESTION, max_tokens=200, **kw).choices[0]
    calls = full.message.tool_calls
    if len(calls) < 2:
        pytest.skip("the model wrote a single call")
    first = format_call(calls[0].function.name, calls[0].function.arguments)
    n = len(tokenizer.encode(first + "\n<tool_call>\n", add_special_tokens=False))
    cut = _chat(client, QUESTION, max_tokens=n + 4, **kw).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None
    (only,) = cut.message.tool_calls
    assert (only.function.name, only.function.arguments) == (
        calls[0].function.name,
        calls[0].function.arguments,
    )
    _check_call(only)


@pytest.fixture(scope="module")
def thinking():
    """A client of a server started with --reasoning-parser deepseek-r1 (the output
    starts inside the reasoning, so the bundled model's whole answer is reasoning) and
    --tool-call-parser llama3 (forced calls are written as Llama 3 JSON)."""
    with running_server("--reasoning-parser", "deepseek-r1", "--tool-call-parser", "llama3") as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)


def test_reasoning_content_end_to_end(client, thinking):
    kw = {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    plain = client.chat.completions.create(**kw).choices[0].message.content
    msg = thinking.chat.completions.create(**kw).choices[0].message
    assert msg.content is None and msg.reasoning_content == plain.strip()
    chunks = [c for c in thinking.chat.completions.create(stream=True, **kw) if c.choices]
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert streamed == plain.strip()
    assert not any(c.choices[0].delta.content for c in chunks)
    # A forced call leaves no room for reasoning: the call is parsed as usual.
    forced = thinking.chat.completions.create(
        tools=TOOLS, tool_choice="required", **{**kw, "max_tokens": 120}
    ).choices[0]
    assert forced.finish_reason == "tool_calls"
    assert getattr(forced.message, "reasoning_content", None) is None
    json.loads(forced.message.tool_calls[0].function.arguments)


def test_forced_call_in_the_parsers_own_format(thinking):
    """With --tool-call-parser llama3 a forced call is written as Llama 3 JSON (the
    generated tokens show it, no Hermes markup) and parsed back, whole and streamed."""
    kw = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "temperature": 0}
    named = {"type": "function", "function": {"name": "get_weather"}}
    choice = thinking.chat.completions.create(
        tool_choice=named, max_tokens=120, logprobs=True, **kw
    ).choices[0]
    raw = "".join(t.token for t in choice.logprobs.content)
    assert raw.startswith('{"name": "get_weather", "parameters": {') and "<tool_call>" not in raw
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    args = _check_call(call, "get_weather")
    # The logprobs list the stop token too.
    expected = f'{{"name": "get_weather", "parameters": {call.function.arguments}}}'
    assert raw == expected + "<|im_end|>"
    chunks = [
        c
        for c in thinking.chat.completions.create(
            tool_choice=named, max_tokens=120, stream=True, **kw
        )
        if c.choices
    ]
    frags = [f for c in chunks for f in (c.choices[0].delta.tool_calls or [])]
    assert frags[0].function.name == "get_weather"
    assert json.loads("".join(f.function.arguments or "" for f in frags)) == args
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_responses_reasoning_item(thinking):
    """/v1/responses with --reasoning-parser: the reasoning is a ``reasoning`` output item
    (the chat route's reasoning_content), streamed with reasoning_text events."""
    import httpx

    from .conftest import sse_payloads

    base = str(thinking.base_url).rstrip("/")
    kw = {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    expected = thinking.chat.completions.create(**kw).choices[0].message.reasoning_content
    body = {"input": QUESTION[0]["content"], "max_output_tokens": 12, "temperature": 0}
    with httpx.Client(base_url=base, timeout=120) as http:
        resp = http.post("/responses", json=body).json()
        (item,) = resp["output"]  # all reasoning: no message item
        assert item["type"] == "reasoning" and item["id"].startswith("rs_")
        assert item["content"] == [{"type": "reasoning_text", "text": expected}]
        assert item["summary"] == [] and item["status"] == "incomplete"
        details = resp["usage"]["output_tokens_details"]
        assert 0 < details["reasoning_tokens"] <= resp["usage"]["output_tokens"]
        with http.stream("POST", "/responses", json={**body, "stream": True}) as r:
            events = [json.loads(p) for p in sse_payloads(r.iter_lines())]
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.reasoning_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * deltas,
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert text == expected == events[-4]["text"]
    assert events[2]["item"]["type"] == "reasoning"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == expected
