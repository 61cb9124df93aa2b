"""Under n-gram speculation, a request decoding beside a prefill (a mixed step, where the
speculative step does not run) verifies the prompt lookup's draft in that forward: its
output equals plain decoding token for token, drafted and kept tokens are counted;
sampled requests draft nothing there, nor do more riders than
--speculative-max-batch-size."""

from __future__ import annotations

import pytest

from radixlm import Engine
from tests.runtime.conftest import MODEL
from tests.runtime.sched_helpers import check_pool

pytestmark = pytest.mark.slow

# Chunks of 16 tokens: the late prompt takes several mixed steps with the first requests
# riding along in each.
SETTINGS = {"max_total_tokens": 4096, "chunked_prefill_size": 16}
REPEAT = "one two three four five six seven, one two three four five six seven, one two"
LATE = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3
KEYS = ("riding_lookup_draft_tokens_total", "riding_lookup_accepted_tokens_total")


@pytest.fixture(scope="module")
def engines():
    with Engine(MODEL, **SETTINGS) as plain:
        with Engine(MODEL, speculative_algorithm="ngram", **SETTINGS) as spec:
            with Engine(
                MODEL, speculative_algorithm="ngram", speculative_max_batch_size=1, **SETTINGS
            ) as narrow:  # fmt: skip
                yield plain, spec, narrow


def _serve(engine: Engine, first: dict, riders: int = 1) -> list[list[int]]:
    """`riders` copies of REPEAT with `first`'s sampling, then, once they decode, LATE
    (greedy): every output, LATE's last."""
    outs: dict[str, list[int]] = {}
    rids = [engine.add_request(REPEAT, {"max_new_tokens": 40, **first}) for _ in range(riders)]
    for _ in range(4):  # prefill, then decode steps
        for chunk in engine.step():
            outs.setdefault(chunk["rid"], []).extend(chunk["output_ids"])
    assert all(outs.get(r) for r in rids)  # decoding when the late prompt arrives
    rids.append(engine.add_request(LATE, {"max_new_tokens": 8, "temperature": 0}))
    done: set[str] = set()
    while len(done) < len(rids):
        for chunk in engine.step():
            outs.setdefault(chunk["rid"], []).extend(chunk["output_ids"])
            if chunk.get("finish_reason") is not None:
                done.add(chunk["rid"])
    return [outs[r] for r in rids]


def _counts(engine: Engine, run) -> tuple[list[list[int]], int, int]:
    """run()'s outputs and the riding draft tokens drafted and kept meanwhile."""
    before = engine.scheduler.stats()
    outs = run()
    after = engine.scheduler.stats()
    drafted, kept = (after[k] - before[k] for k in KEYS)
    check_pool(engine.scheduler, idle=True)
    return outs, drafted, kept


@pytest.mark.parametrize(
    "first", [{"temperature": 0}, {"temperature": 0.7, "seed": 5}], ids=["greedy", "sampled"]
)
def test_riding_requests_verify_lookups_in_mixed_steps(engines, first):
    plain, spec, _ = engines
    assert all(k not in plain.scheduler.stats() for k in KEYS)  # no speculation: none
    want = _serve(plain, first)
    got, drafted, kept = _counts(spec, lambda: _serve(spec, first))
    if first["temperature"] == 0:  # the repeated text: drafted and (mostly) kept
        assert got == want
        assert 0 < kept <= drafted
    else:  # a sampled row's draws must not meet an extend row's rounding; its later
        # speculative steps sample by rejection, so only the greedy late request compares
        assert got[-1] == want[-1]
        assert drafted == kept == 0


def test_no_riding_drafts_above_the_speculative_batch_limit(engines):
    plain, _, narrow = engines
    greedy = {"temperature": 0}
    got, drafted, _ = _counts(narrow, lambda: _serve(narrow, greedy, riders=2))
    assert got == _serve(plain, greedy, riders=2)
    assert drafted == 0
