"""Under n-gram speculation, a request decoding beside a prefill (a mixed step, where the
speculative step does not run) verifies the prompt lookup's draft in that forward: its
output equals plain decoding token for token, drafted and kept tokens are counted, and
sampled requests draft nothing there."""

from __future__ import annotations

import pytest

from radixlm import Engine
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool

pytestmark = pytest.mark.slow

# Chunks of 16 tokens: the late prompt takes several mixed steps with the first request
# riding along in each.
SETTINGS = {"max_total_tokens": 4096, "chunked_prefill_size": 16}
REPEAT = "one two three four five six seven, one two three four five six seven, one two"
LATE = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3


@pytest.fixture(scope="module")
def engines():
    with Engine(MODEL, **SETTINGS) as plain:
        with Engine(MODEL, speculative_algorithm="ngram", **SETTINGS) as spec:
            yield plain, spec


def _serve(engine: Engine, first: dict) -> tuple[list[int], list[int]]:
    """REPEAT with `first`'s sampling, then, once it decodes, LATE (greedy): both
    outputs."""
    outs: dict[str, list[int]] = {}
    a = engine.add_request(REPEAT, {"max_new_tokens": 40, **first})
    for _ in range(4):  # prefill, then decode steps
        for chunk in engine.step():
            outs.setdefault(chunk["rid"], []).extend(chunk["output_ids"])
    assert outs[a]  # decoding when the late prompt arrives
    b = engine.add_request(LATE, {"max_new_tokens": 8, "temperature": 0})
    done: set[str] = set()
    while len(done) < 2:
        for chunk in engine.step():
            outs.setdefault(chunk["rid"], []).extend(chunk["output_ids"])
            if chunk.get("finish_reason") is not None:
                done.add(chunk["rid"])
    return outs[a], outs[b]


@pytest.mark.parametrize(
    "first", [{"temperature": 0}, {"temperature": 0.7, "seed": 5}], ids=["greedy", "sampled"]
)
def test_riding_requests_verify_lookups_in_mixed_steps(engines, first):
    plain, spec = engines
    keys = ("riding_lookup_draft_tokens_total", "riding_lookup_accepted_tokens_total")
    before = spec.scheduler.stats()
    assert all(k not in plain.scheduler.stats() for k in keys)  # no speculation: none
    got, want = _serve(spec, first), _serve(plain, first)
    after = spec.scheduler.stats()
    drafted, kept = (after[k] - before[k] for k in keys)
    if first["temperature"] == 0:  # the repeated text: drafted and (mostly) kept
        assert got == want
        assert 0 < kept <= drafted
    else:  # a sampled row's draws must not meet an extend row's rounding; its later
        # speculative steps sample by rejection, so only the greedy late request compares
        assert got[1] == want[1]
        assert drafted == kept == 0
    check_pool(spec.scheduler, idle=True)
