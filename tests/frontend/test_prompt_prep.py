"""Request preparation in the HTTP process, without a server: a list of prompts stops
tokenizing at the first one that cannot fit the context (a 400 on `prompt`)."""

from __future__ import annotations

import pytest

from radixlm.config import ServerArgs
from radixlm.frontend.errors import APIError
from radixlm.frontend.serving_openai import OpenAIServing
from radixlm.runtime.server.ipc import IpcPaths
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

from .conftest import MODEL


@pytest.fixture(scope="module")
def serving(tokenizer):
    facts = {"vocab_size": 49152, "context_length": 64, "max_total_tokens": 1024}
    ipc = IpcPaths("/nonexistent", "ipc://a", "ipc://b", "ipc://c")
    tm = TokenizerManager(ServerArgs(model=MODEL), ipc, facts, tokenizer=tokenizer)
    return OpenAIServing(tm)


def test_a_prompt_list_stops_at_the_first_prompt_over_the_context(serving, monkeypatch):
    calls = []
    encode = serving.tm.tokenizer.encode

    def counted(text, **kw):
        calls.append(len(text))
        return encode(text, **kw)

    monkeypatch.setattr(serving.tm.tokenizer, "encode", counted)
    fits = "word " * 10
    too_long = "word " * 100  # about 100 tokens; the context is 64
    assert len(serving._completion_prompts([fits, fits])) == 2
    calls.clear()
    with pytest.raises(APIError, match="the context length is 64") as info:
        serving._completion_prompts([fits, too_long, too_long, too_long])
    assert info.value.status == 400 and info.value.param == "prompt"
    assert info.value.code == "context_length_exceeded"
    assert calls == [len(fits), len(too_long)]
