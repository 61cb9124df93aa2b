"""/v1/completions, /v1/chat/completions and /v1/models through the real `openai` client:
greedy output equals the in-process Engine's, streamed text equals non-streamed text."""

from __future__ import annotations

import json

from .conftest import (
    CHAT_MAX,
    CHAT_MESSAGES,
    COMPLETION_MAX,
    COMPLETION_PROMPT,
    MODEL,
    chat_ids,
    sse_payloads,
)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_completion_equals_engine(client, engine_ref):
    ref = engine_ref["completion"]
    resp = client.completions.create(
        model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=COMPLETION_MAX, temperature=0
    )
    assert resp.object == "text_completion"
    assert resp.choices[0].text == ref["text"]
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    assert resp.usage.completion_tokens == COMPLETION_MAX
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + COMPLETION_MAX
    assert resp.usage.prompt_tokens_details.cached_tokens >= 0


def test_completion_stream_equals_nonstream(client, engine_ref):
    stream = client.completions.create(
        model=MODEL,
        prompt=COMPLETION_PROMPT,
        max_tokens=COMPLETION_MAX,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == engine_ref["completion"]["text"]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == COMPLETION_MAX


def test_chat_equals_engine(client, engine_ref, tokenizer):
    ref = engine_ref["chat"]
    resp = client.chat.completions.create(
        model=MODEL, messages=CHAT_MESSAGES, max_tokens=CHAT_MAX, temperature=0
    )
    assert resp.object == "chat.completion"
    msg = resp.choices[0].message
    assert msg.role == "assistant" and msg.content == ref["text"]
    assert resp.choices[0].finish_reason == ref["finish_reason"]
    # The chat template brings its own BOS; nothing adds a second one.
    ids = chat_ids(tokenizer, CHAT_MESSAGES)
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
    assert resp.usage.prompt_tokens == len(ids)


def test_chat_stream_equals_nonstream(client, engine_ref):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT_MESSAGES,
        max_completion_tokens=CHAT_MAX,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == engine_ref["chat"]["text"]
    assert chunks[-1].choices[0].finish_reason == engine_ref["chat"]["finish_reason"]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1


def test_stream_wire_format(http):
    """Raw SSE: every event is a JSON chunk, the last one is [DONE]."""
    body = {"prompt": COMPLETION_PROMPT, "max_tokens": 3, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(r.iter_lines())
    assert payloads[-1] == "[DONE]"
    for p in payloads[:-1]:
        assert json.loads(p)["object"] == "text_completion"


def test_stop_string(client, engine_ref):
    full = engine_ref["completion"]["text"]  # ", the city of Nova Haven was ..."
    stop = full.split()[3]
    resp = client.completions.create(
        model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=COMPLETION_MAX, temperature=0, stop=stop
    )
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].text == full[: full.index(stop)]
    stream = client.completions.create(
        model=MODEL,
        prompt=COMPLETION_PROMPT,
        max_tokens=COMPLETION_MAX,
        temperature=0,
        stop=[stop, "zzz"],
        stream=True,
    )
    assert "".join(c.choices[0].text for c in stream) == full[: full.index(stop)]


def test_prompt_forms(client, engine_ref, tokenizer):
    """A list of strings gives one choice per prompt; token ids equal the encoded text."""
    ids = tokenizer.encode(COMPLETION_PROMPT, add_special_tokens=False)
    for prompt in ([COMPLETION_PROMPT, "The capital of France is"], ids, [ids, ids]):
        resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
        n = 2 if isinstance(prompt[0], (str, list)) else 1
        assert [c.index for c in resp.choices] == list(range(n))
        assert resp.choices[0].text == engine_ref["completion"]["text"][: len(resp.choices[0].text)]
        assert resp.usage.completion_tokens == 4 * n


def test_seeded_sampling_is_reproducible(client):
    def run() -> str:
        return (
            client.completions.create(
                model=MODEL,
                prompt="Tell me a story",
                max_tokens=6,
                temperature=1.0,
                top_p=0.9,
                seed=7,
            )
            .choices[0]
            .text
        )

    assert run() == run()


def test_noop_fields_accepted(client):
    """OpenAI fields at their default (no-op) values are accepted; `user` is ignored."""
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, *CHAT_MESSAGES],
        max_tokens=2,
        n=1,
        frequency_penalty=0,
        presence_penalty=0.0,
        logprobs=False,
        user="someone",
        response_format={"type": "text"},
        extra_body={"top_k": 1},
    )
    assert resp.usage.completion_tokens == 2


def test_content_parts_and_developer_role(client):
    """Text content parts join like a string; `developer` is the system turn."""

    def run(system_role: str, content) -> str:
        return (
            client.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": system_role, "content": "Answer in one word."},
                    {"role": "user", "content": content},
                ],
                max_tokens=3,
                temperature=0,
            )
            .choices[0]
            .message.content
        )

    text = "What color is the sky?"
    assert run("developer", [{"type": "text", "text": text}]) == run("system", text)


def test_stream_several_prompts(client):
    stream = client.completions.create(
        model=MODEL, prompt=["Red,", "One,"], max_tokens=3, temperature=0, stream=True
    )
    texts, reasons = ["", ""], [None, None]
    for chunk in stream:
        choice = chunk.choices[0]
        texts[choice.index] += choice.text
        reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert reasons == ["length", "length"]
    batch = client.completions.create(
        model=MODEL, prompt=["Red,", "One,"], max_tokens=3, temperature=0
    )
    assert texts == [c.text for c in batch.choices]
