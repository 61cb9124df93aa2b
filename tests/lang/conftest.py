"""Fixtures for program tests on the bundled model: one in-process Engine backend and one
real `radixlm serve` (RuntimeEndpoint / OpenAI backends) for the whole tests/lang session,
started on first use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

MODEL = "smollm2-135m"
API_KEY = "lang-key"


@pytest.fixture(scope="session")
def engine_backend():
    """The EngineBackend of a shared Engine (programs and server counters go through it)."""
    import radixlm
    from radixlm.lang.backend.engine import EngineBackend

    engine = radixlm.Engine(model=MODEL, num_threads=1, max_total_tokens=20000)
    try:
        yield EngineBackend.for_engine(engine)
    finally:
        engine.shutdown()


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    from tests.frontend.conftest import running_server

    with running_server("--api-key", API_KEY) as url:
        yield url


@pytest.fixture(scope="session")
def endpoint(server_url):
    import radixlm as rl

    backend = rl.RuntimeEndpoint(server_url, api_key=API_KEY)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from radixlm.runtime.executor.model_registry import local_hf_dir

    return AutoTokenizer.from_pretrained(local_hf_dir(MODEL))


def scheduler_counters(backend) -> dict[str, int]:
    """The server's cumulative scheduler counters (tokens)."""
    stats = backend.get_server_info()["scheduler"]
    return {
        k: stats[k] for k in ("prompt_tokens_total", "cached_tokens_total", "prefill_tokens_total")
    }


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}
