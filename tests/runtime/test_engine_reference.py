"""Greedy fp32 output equals transformers token for token; cache hits change nothing."""

from __future__ import annotations

import pytest

from radixlm import Engine
from tests.runtime.conftest import MODEL, greedy


def _check_accounting(engine: Engine, idle: bool = True) -> None:
    mem = engine.get_server_info()["memory"]
    assert mem["free"] + mem["evictable"] + mem["protected"] + mem["held"] == mem["total"]
    if idle:
        assert mem["held"] == 0 and mem["protected"] == 0


@pytest.fixture(scope="module", params=["gguf", "fp32"])
def engine(request):
    """The bundled model's weights kept as its GGUF blocks (the default) and dequantized."""
    with Engine(MODEL, max_total_tokens=8192, weight_format=request.param) as e:
        yield e


def test_one_by_one_matches_transformers(engine, prompts, reference):
    for ids, ref in zip(prompts, reference):
        out = engine.generate(input_ids=ids, sampling_params=greedy())
        assert out["output_ids"] == ref
        assert out["usage"]["prompt_tokens"] == len(ids)
        assert out["usage"]["completion_tokens"] == len(ref)
    _check_accounting(engine)


def test_one_batch_matches_transformers(engine, prompts, reference):
    outs = engine.generate(input_ids=prompts, sampling_params=greedy())
    assert [o["output_ids"] for o in outs] == reference
    _check_accounting(engine)


def test_step_driven_arrivals_match_transformers(engine, prompts, reference):
    """Requests added between `step` calls (one, two, then the rest, each after a step)
    join the running batch mid-flight and still decode the reference tokens."""
    out: dict[str, list[int]] = {}
    rids: list[str] = []
    waves = [prompts[:1], prompts[1:3], prompts[3:]]
    while waves or engine.has_unfinished_requests():
        if waves:
            for ids in waves.pop(0):
                rids.append(engine.add_request(input_ids=ids, sampling_params=greedy()))
        for chunk in engine.step():
            out.setdefault(chunk["rid"], []).extend(chunk["output_ids"])
    assert [out[rid] for rid in rids] == reference
    _check_accounting(engine)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_cache_hit_equals_miss(page_size, prompts, reference):
    with Engine(MODEL, max_total_tokens=8192, page_size=page_size) as engine:
        first = engine.generate(input_ids=prompts, sampling_params=greedy())
        second = engine.generate(input_ids=prompts, sampling_params=greedy())
        assert [o["output_ids"] for o in first] == reference
        assert [o["output_ids"] for o in second] == reference
        # First pass: hits only on prefixes shared with other prompts of the batch (the
        # chat prompts share a template; chunked prefill admits over several steps).
        for i, (ids, o) in enumerate(zip(prompts, first)):
            shared = max(_lcp(ids[:-1], p) for j, p in enumerate(prompts) if j != i)
            assert o["usage"]["cached_tokens"] <= shared - shared % page_size
        for ids, o in zip(prompts, second):
            cached = o["usage"]["cached_tokens"]
            # Everything but the last prompt token can hit, rounded down to a page.
            assert cached == (len(ids) - 1) // page_size * page_size
        _check_accounting(engine)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_small_pool_forces_eviction(prompts, reference):
    # 1,600 slots cannot hold the 1,500-token prompt's cache next to the others, so the
    # radix cache must evict while the output stays exact.
    with Engine(MODEL, max_total_tokens=1600, page_size=4) as engine:
        evicted: list[int] = []
        tree = engine.scheduler.tree
        original = tree.evict

        def counting_evict(n: int) -> int:
            freed = original(n)
            evicted.append(freed)
            return freed

        tree.evict = counting_evict
        for _ in range(2):
            for ids, ref in zip(prompts, reference):
                assert engine.generate(input_ids=ids, sampling_params=greedy())["output_ids"] == ref
                _check_accounting(engine)
        assert sum(evicted) > 0
