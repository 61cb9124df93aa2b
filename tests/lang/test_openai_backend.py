"""The OpenAI backend against radixlm's own /v1 routes: gens agree with the native
backend, streaming works, and what the API cannot express fails clearly."""

from __future__ import annotations

import pytest

import radixlm as rl
from radixlm.errors import InvalidRequestError
from radixlm.lang import UnsupportedByBackendError
from tests.lang.conftest import API_KEY, MODEL

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat_api(server_url):
    return rl.OpenAI(MODEL, base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def completion_api(server_url):
    return rl.OpenAI(
        MODEL, base_url=f"{server_url}/v1", api_key=API_KEY, is_chat_model=False, max_retries=0
    )


@rl.function
def chat(s, question):
    s += rl.system("You are a helpful assistant.")
    s += rl.user(question)
    s += rl.assistant(rl.gen("answer", max_tokens=12))
    s += rl.user("Thanks. One more word?")
    s += rl.assistant(rl.gen("more", max_tokens=4))


def test_chat_gens_match_the_native_backend(chat_api, endpoint):
    via_openai = chat.run(question="Name a planet.", backend=chat_api, temperature=0)
    native = chat.run(question="Name a planet.", backend=endpoint, temperature=0)
    assert via_openai.error() is None
    assert via_openai["answer"] == native["answer"] and via_openai["answer"]
    assert via_openai["more"] == native["more"]
    assert via_openai.messages() == native.messages()
    meta = via_openai.get_meta_info("more")
    assert meta["prompt_tokens"] > 0 and meta["finish_reason"]["type"] in ("stop", "length")


def test_chat_streaming(chat_api):
    whole = chat.run(question="Name a color.", backend=chat_api, temperature=0)
    streamed = chat.run(question="Name a color.", backend=chat_api, temperature=0, stream=True)
    assert "".join(streamed.text_iter("answer")) == whole["answer"] == streamed["answer"]


def test_completion_model_gen(completion_api, endpoint):
    @rl.function
    def complete(s):
        s += "Once upon a time" + rl.gen("story", max_tokens=10, stop=".")

    a = complete.run(backend=completion_api, temperature=0)
    b = complete.run(backend=endpoint, temperature=0)
    assert a["story"] == b["story"] and a["story"]


def test_unsupported_primitives_fail_clearly(chat_api):
    @rl.function
    def picks(s):
        s += rl.user("Yes or no?")
        s += rl.assistant(rl.select("x", choices=["yes", "no"]))

    @rl.function
    def regex(s):
        s += rl.user("A digit?")
        s += rl.assistant(rl.gen("x", regex="[0-9]"))

    @rl.function
    def outside_assistant(s):
        s += rl.user("Hi") + rl.gen("x", max_tokens=2)

    for program, message in [
        (picks, "cannot score given choices"),
        (regex, "regex"),
        (outside_assistant, "assistant turn"),
    ]:
        state = program.run(backend=chat_api)
        assert isinstance(state.error(), UnsupportedByBackendError)
        with pytest.raises(UnsupportedByBackendError, match=message):
            state["x"]


def test_server_errors_surface(chat_api):
    @rl.function
    def too_long(s):
        s += rl.user("Hi")
        s += rl.assistant(rl.gen("x", max_tokens=10**6))

    state = too_long.run(backend=chat_api)
    assert isinstance(state.error(), InvalidRequestError)
