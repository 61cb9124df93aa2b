"""The batched sampler against brute-force filters."""

from __future__ import annotations

import pytest
import torch

from radixlm.errors import InvalidRequestError
from radixlm.runtime.sampling import Sampler, SamplingParams


def _brute(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Top-k first, then top-p over the renormalized top-k mass (as HF and vLLM), then min-p."""
    order = torch.argsort(logits, descending=True).tolist()
    if p.top_k > 0:
        order = order[: p.top_k]
    probs = torch.zeros_like(logits)
    probs[order] = torch.softmax(logits[order] / p.temperature, -1)
    keep, mass = [], 0.0
    for rank, i in enumerate(order):
        if rank > 0 and mass >= p.top_p:
            break
        keep.append(i)
        mass += float(probs[i])
    out = torch.zeros_like(probs)
    kept = torch.softmax(logits[keep] / p.temperature, -1)
    if p.min_p > 0:
        kept = torch.where(kept >= p.min_p * kept.max(), kept, torch.zeros_like(kept))
    out[keep] = kept / kept.sum()
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9),
        SamplingParams(temperature=1.0, min_p=0.2),
    ],
)
def test_filters_match_brute_force(params):
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    got = Sampler._filter(logits / params.temperature, [params] * 3)
    for row in range(3):
        torch.testing.assert_close(got[row], _brute(logits[row], params), atol=1e-6, rtol=1e-5)


def test_greedy_rows_are_argmax_and_seeds_reproduce():
    torch.manual_seed(1)
    logits = torch.randn(3, 100)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=3)] * 2
    params = params[:3]

    def gens():
        return [None, torch.Generator().manual_seed(3), None]

    a = Sampler().sample(logits, params, gens())
    b = Sampler().sample(logits, params, gens())
    assert a.tolist() == b.tolist()
    assert a[0] == logits[0].argmax() and a[2] == logits[2].argmax()


def test_sampled_token_is_inside_top_k():
    logits = torch.arange(100, dtype=torch.float32)[None]
    p = SamplingParams(temperature=5.0, top_k=3)
    for seed in range(20):
        tok = Sampler().sample(logits, [p], [torch.Generator().manual_seed(seed)])
        assert int(tok) in (97, 98, 99)


def test_from_any_validation():
    assert SamplingParams.from_any({"max_new_tokens": 3}).max_new_tokens == 3
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_any({"top_k": 0})
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_any({"min_p": 1.0})
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_any("greedy")
