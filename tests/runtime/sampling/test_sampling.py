"""The batched sampler against brute-force filters."""

from __future__ import annotations

import pytest
import torch

from radixlm.errors import InvalidRequestError
from radixlm.runtime.sampling.penalties import apply_processors
from radixlm.runtime.sampling.random_draw import derive_seed, inverse_cdf_draw, row_uniforms
from radixlm.runtime.sampling.sampler import Sampler, SamplingParams
from radixlm.runtime.sched.request import Req


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


def test_filters_grow_the_candidate_set_and_mix_rows():
    """A flat 1000-token distribution needs several candidate doublings (64 -> 1000)
    for top-p 0.95 and min-p 0.01; rows with different filters share one batch."""
    torch.manual_seed(3)
    logits = torch.randn(5, 1000) * 0.3
    params = [
        SamplingParams(temperature=1.0, top_p=0.95),
        SamplingParams(temperature=1.0, min_p=0.01),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_k=100, top_p=0.5),
        SamplingParams(temperature=1.0, top_p=0.05),
    ]
    got = Sampler._filter(logits, params)
    for row, p in enumerate(params):
        torch.testing.assert_close(got[row], _brute(logits[row], p), atol=1e-6, rtol=1e-5)
    assert (got[0] > 0).sum() > 64  # the nucleus really was wider than the first guess


def _req(params: SamplingParams, seed: int = 0, input_ids=(5,), output_ids=()) -> Req:
    return Req(
        rid="r", input_ids=list(input_ids), params=params, output_ids=list(output_ids), seed=seed
    )


def test_greedy_rows_are_argmax_and_seeds_reproduce():
    torch.manual_seed(1)
    logits = torch.randn(3, 100)
    reqs = [
        _req(SamplingParams(temperature=0)),
        _req(SamplingParams(temperature=1.0), seed=3),
        _req(SamplingParams(temperature=0)),
    ]
    a = Sampler().sample(logits, reqs)
    b = Sampler().sample(logits, reqs)
    assert a.tolist() == b.tolist()
    assert a[0] == logits[0].argmax() and a[2] == logits[2].argmax()


def test_sampled_token_is_inside_top_k():
    logits = torch.arange(100, dtype=torch.float32)[None]
    p = SamplingParams(temperature=5.0, top_k=3)
    for seed in range(20):
        tok = Sampler().sample(logits, [_req(p, seed=seed)])
        assert int(tok) in (97, 98, 99)


def test_seeded_draw_is_independent_of_batch_composition():
    torch.manual_seed(2)
    logits = torch.randn(4, 300)
    p = SamplingParams(temperature=1.0, top_p=0.95)
    reqs = [_req(p, seed=s, output_ids=[1] * s) for s in (11, 12, 13, 14)]
    batched = Sampler().sample(logits, reqs).tolist()
    alone = [int(Sampler().sample(logits[i : i + 1], [reqs[i]])) for i in range(4)]
    assert batched == alone
    reordered = Sampler().sample(logits.flip(0), reqs[::-1]).tolist()
    assert reordered == batched[::-1]


def test_draw_follows_the_distribution():
    """Frequencies over many (seed, position) pairs match the probabilities (chi-square)."""
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    n = 20000
    seeds = torch.arange(n, dtype=torch.int64) * 7919
    toks = inverse_cdf_draw(probs.expand(n, -1), seeds, torch.arange(n) % 13)
    counts = torch.bincount(toks, minlength=5).double()
    assert counts[4] == 0
    expected = probs[:4].double() * n
    chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
    assert chi2 < 16.3  # p = 0.001 for 3 degrees of freedom


def test_uniforms_are_uniform_and_distinct_per_position():
    n = 20000
    u = row_uniforms(torch.full((n,), 7), torch.arange(n))
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert len(set(u.tolist())) == n
    other = row_uniforms(torch.full((n,), 8), torch.arange(n))
    assert abs(float(torch.corrcoef(torch.stack([u, other]))[0, 1])) < 0.05
    assert derive_seed(5, 0) == 5 and len({derive_seed(5, i) for i in range(50)}) == 50


def _reference_processed(logits: torch.Tensor, req: Req, eos: list[int]) -> torch.Tensor:
    """Hand-written per-token reference of every logit processor (one row)."""
    p = req.params
    out = logits.clone()
    for tok, bias in (p.logit_bias or {}).items():
        out[tok] += bias
    for tok in set(req.input_ids + req.output_ids):
        if p.repetition_penalty != 1.0:
            v = float(out[tok])
            out[tok] = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
    for tok in set(req.output_ids):
        count = req.output_ids.count(tok)
        out[tok] -= count * p.frequency_penalty + p.presence_penalty
    if len(req.output_ids) < p.min_new_tokens:
        for tok in set(p.stop_token_ids) | set(eos):
            out[tok] = float("-inf")
    return out


def test_processors_match_hand_computed_reference():
    torch.manual_seed(3)
    logits = torch.randn(4, 64) * 3
    reqs = [
        _req(SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4), output_ids=[3, 3, 9]),
        _req(SamplingParams(repetition_penalty=1.3), input_ids=[1, 2, 3], output_ids=[3, 40]),
        _req(
            SamplingParams(logit_bias={7: 5.0, 8: -100.0}, min_new_tokens=4, stop_token_ids=[11]),
            output_ids=[1],
        ),
        _req(SamplingParams()),  # no processor: row untouched
    ]
    got = apply_processors(logits, reqs, eos_token_ids=[2])
    for b, req in enumerate(reqs):
        torch.testing.assert_close(got[b], _reference_processed(logits[b], req, [2]))
    assert apply_processors(logits, [reqs[3]], [2]) is logits  # nothing to do: no copy


def test_penalties_change_greedy_exactly_as_reference():
    logits = torch.tensor([[2.0, 1.9, 0.5, -1.0]])
    # Token 0 was generated twice: 2.0 - 2 * 0.1 - 0.0 = 1.8 < 1.9 -> token 1 wins.
    req = _req(SamplingParams(temperature=0, frequency_penalty=0.1), output_ids=[0, 0])
    assert int(Sampler().sample(logits, [req])) == 1
    # Negative presence penalty favours the repeated token: 1.9 + 0.5 > 2.0.
    req = _req(SamplingParams(temperature=0, presence_penalty=-0.5), output_ids=[1])
    assert int(Sampler().sample(logits, [req])) == 1
    # Repetition penalty over the prompt: 2.0 / 1.2 = 1.67 < 1.9.
    req = _req(SamplingParams(temperature=0, repetition_penalty=1.2), input_ids=[0])
    assert int(Sampler().sample(logits, [req])) == 1
    # min_new_tokens masks EOS (id 0 here) until reached.
    req = _req(SamplingParams(temperature=0, min_new_tokens=2), output_ids=[3])
    assert int(Sampler(eos_token_ids=[0]).sample(logits, [req])) == 1
    req = _req(SamplingParams(temperature=0, logit_bias={3: 10.0}))
    assert int(Sampler().sample(logits, [req])) == 3


def test_penalty_validation():
    for bad in (
        {"frequency_penalty": 2.5},
        {"presence_penalty": -3},
        {"repetition_penalty": 0},
        {"min_new_tokens": -1},
        {"logit_bias": {"x": 1.0}},
        {"logit_bias": {"5": 101.0}},
        {"logit_bias": {"-1": 1.0}},
    ):
        with pytest.raises(InvalidRequestError):
            SamplingParams.from_any(bad)
    assert SamplingParams.from_any({"logit_bias": {"5": -2.5}}).logit_bias == {5: -2.5}
    with pytest.raises(InvalidRequestError, match="min_new_tokens must be <= max_new_tokens"):
        SamplingParams.from_any({"min_new_tokens": 5, "max_new_tokens": 2})
    assert SamplingParams.from_any({"min_new_tokens": 2, "max_new_tokens": 2}).min_new_tokens == 2


def test_stop_may_be_one_string():
    assert SamplingParams.from_any({"stop": "\n"}).stop == ["\n"]
    assert SamplingParams.from_any({"stop": ["a", "b"]}).stop == ["a", "b"]
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_any({"stop": ""})


def test_from_any_validation():
    assert SamplingParams.from_any({"max_new_tokens": 3}).max_new_tokens == 3
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_any({"top_k": 0})
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_any({"min_p": 1.0})
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_any("greedy")
