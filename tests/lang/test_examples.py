"""Every program in examples/ runs on the bundled model (in-process Engine backend)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def load():
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(EXAMPLES))


def test_few_shot_qa(load, engine_backend):
    out = load("few_shot_qa").main(engine_backend)
    assert len(out["answers"]) == 8 and all(out["answers"])
    assert out["cache"]["cache_hit_rate"] > 0.5  # the shared prefix is reused


def test_multi_turn_chat(load, engine_backend):
    out = load("multi_turn_chat").main(engine_backend)
    assert [m["role"] for m in out["messages"]] == ["system"] + ["user", "assistant"] * 3
    assert out["cache"]["cached_tokens"] > 0


def test_react_agent(load, engine_backend):
    mod = load("react_agent")
    assert mod.calculator("12 * 7") == "84"
    assert mod.calculator("__import__('os')").startswith("error")
    out = mod.main(engine_backend)
    assert "Action: " in out["text"] and out["answer"] is not None
    assert out["cache"]["cached_tokens"] > 0


def test_tree_of_thought(load, engine_backend):
    out = load("tree_of_thought").main(engine_backend)
    assert len(out["plans"]) == 3 and out["best"] in ("1", "2", "3")
    assert out["cache"]["cached_tokens"] > 0


def test_json_decode(load, engine_backend):
    out = load("json_decode").main(engine_backend)
    for record in out["records"]:
        assert set(record) == {"name", "country", "population_millions", "is_capital"}
        assert isinstance(record["population_millions"], int)
        assert isinstance(record["is_capital"], bool)


def test_streaming(load, engine_backend):
    out = load("streaming").main(engine_backend)
    assert len(out["pieces"]) > 1 and "".join(out["pieces"]) == out["story"]
