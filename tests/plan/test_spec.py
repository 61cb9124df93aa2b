"""Speculative decoding: Leviathan et al. 2023 formulas and the batch break-even."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixlm.plan.cost import Deployment
from radixlm.plan.spec import SpecModel, best_draft_len, expected_tokens, leviathan_speedup


def test_expected_tokens_values():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    # (1 - 0.8^5) / 0.2 = 3.3616
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616)


def test_leviathan_speedup():
    # a = 0.8, k = 4, c = 0.05: 3.3616 / 1.2
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert leviathan_speedup(0.0, 3, 0.1) < 1.0


@given(a=st.floats(0.0, 0.999), k=st.integers(1, 20))
def test_expected_tokens_bounds(a, k):
    e = expected_tokens(a, k)
    assert 1.0 <= e <= k + 1
    assert expected_tokens(a, k + 1) >= e
    assert e == pytest.approx(sum(a**i for i in range(k + 1)))


def test_best_draft_len_grows_with_acceptance():
    assert best_draft_len(0.5, 0.05) < best_draft_len(0.9, 0.05)


def test_invalid_acceptance():
    with pytest.raises(ValueError):
        expected_tokens(1.5, 3)


def test_batch1_matches_leviathan(h100, specs):
    # Memory-bound verify costs one decode step, so the roofline model reduces to theorem 3.8.
    sm = SpecModel(Deployment(specs["Llama-3-8B"], h100), 0.7, 4, context=512)
    assert sm.point(1).speedup == pytest.approx(leviathan_speedup(0.7, 4, 0.05), rel=1e-3)


def test_break_even_batch_short_context(h100, specs):
    sm = SpecModel(Deployment(specs["Llama-3-8B"], h100), 0.7, 4, context=64)
    b = sm.break_even_batch()
    assert b is not None and b > 1
    assert sm.point(b).speedup <= 1.0 < sm.point(b - 1).speedup


def test_long_context_keeps_paying(h100, specs):
    # KV reads keep decode memory-bound at long context, so verification stays cheap.
    sm = SpecModel(Deployment(specs["Llama-3-8B"], h100), 0.7, 4, context=8192)
    assert sm.break_even_batch(max_batch=4096) is None


def test_useless_draft_never_pays(h100, specs):
    sm = SpecModel(Deployment(specs["Llama-3-8B"], h100), 0.0, 4, context=512, draft_cost=0.2)
    assert sm.break_even_batch() == 1


def test_draft_model_priced_by_roofline(h100, specs):
    target = Deployment(specs["Llama-3-70B"], h100, tp=8)
    draft = Deployment(specs["Llama-3-8B"], h100, tp=8)
    p = SpecModel(target, 0.8, 4, context=512, draft=draft).point(1)
    assert p.draft_ms == pytest.approx(draft.decode(1, 512).time_s * 1e3)
