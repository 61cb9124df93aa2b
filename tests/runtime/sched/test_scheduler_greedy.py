"""Greedy output equals transformers token for token under every scheduling setting:
policies, chunk sizes, page sizes, mixed steps, and a pool small enough to retract."""

from __future__ import annotations

import pytest

from radixlm import Engine
from tests.runtime.conftest import MODEL, greedy
from tests.runtime.sched_helpers import check_pool

SHORT = [0, 1, 2, 3, 4, 6, 7]  # every fixture prompt but the ~1,500-token one
SOME = [0, 4, 6, 7]
NEW = 8  # the first 8 reference tokens (greedy is a prefix-closed sequence)

# (engine settings, prompt indices): each policy once, chunk sizes 1/7/64/512 and page
# sizes 1/4/16 spread over them; the long prompt runs in 512-token chunks.
CONFIGS = [
    ({"schedule_policy": "lpm", "chunked_prefill_size": 7, "page_size": 4}, SHORT),
    ({"schedule_policy": "dfs-weight", "chunked_prefill_size": 64, "page_size": 1}, SOME),
    ({"schedule_policy": "fcfs", "chunked_prefill_size": 1, "page_size": 1}, [0, 1, 4]),
    ({"schedule_policy": "lof", "chunked_prefill_size": 512, "page_size": 16}, [0, 5, 6, 7]),
    ({"schedule_policy": "random", "chunked_prefill_size": 7, "page_size": 16}, SOME),
    (
        {"chunked_prefill_size": 7, "page_size": 4, "enable_mixed_chunk": False},
        [0, 1, 6, 7],
    ),
]


@pytest.mark.parametrize(
    "settings,which", CONFIGS, ids=lambda v: str(v) if isinstance(v, dict) else ""
)
def test_greedy_unchanged(settings, which, prompts, reference):
    with Engine(MODEL, max_total_tokens=4096, **settings) as engine:
        batch = [prompts[i] for i in which]
        expected = [reference[i][:NEW] for i in which]
        outs = engine.generate(input_ids=batch, sampling_params=greedy(NEW))
        assert [o["output_ids"] for o in outs] == expected
        # Second pass: every prompt hits the cache (all but the last token, page-aligned).
        outs = engine.generate(input_ids=batch, sampling_params=greedy(NEW))
        assert [o["output_ids"] for o in outs] == expected
        ps = settings["page_size"]
        assert [o["usage"]["cached_tokens"] for o in outs] == [
            (len(p) - 1) // ps * ps for p in batch
        ]
        check_pool(engine.scheduler, idle=True)


@pytest.mark.parametrize("page_size", [1, 4])
def test_tiny_pool_retracts_and_stays_exact(page_size, prompts, reference):
    # 96 slots cannot hold 7 requests of up to 38 + 16 tokens at once; an optimistic
    # new-token estimate admits them all, so decode runs out of slots and retracts.
    with Engine(
        MODEL, max_total_tokens=96, page_size=page_size, schedule_conservativeness=0.3
    ) as engine:
        outs = engine.generate(input_ids=[prompts[i] for i in SHORT], sampling_params=greedy())
        assert [o["output_ids"] for o in outs] == [reference[i] for i in SHORT]
        for i, o in zip(SHORT, outs):  # usage describes the original prompt and output
            assert o["usage"]["prompt_tokens"] == len(prompts[i])
            assert o["usage"]["completion_tokens"] == len(reference[i])
        stats = engine.get_server_info()["scheduler"]
        assert stats["num_retracted_total"] > 0
        assert stats["new_token_ratio"] > 0.21  # raised by the retraction
        check_pool(engine.scheduler, idle=True)


def test_retracted_stream_neither_repeats_nor_splices(prompts, reference):
    with Engine(MODEL, max_total_tokens=96, schedule_conservativeness=0.3) as engine:
        chunks: dict[int, list[int]] = {}
        stream = engine.generate(
            input_ids=[prompts[i] for i in SHORT], sampling_params=greedy(), stream=True
        )
        for chunk in stream:
            chunks.setdefault(chunk["index"], []).extend(chunk["output_ids"])
        assert [chunks[k] for k in range(len(SHORT))] == [reference[i] for i in SHORT]
        assert engine.get_server_info()["scheduler"]["num_retracted_total"] > 0
