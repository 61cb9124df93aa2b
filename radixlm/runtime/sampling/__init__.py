"""Turning logits into tokens: sampling parameters and the batched sampler, penalties,
counter-based seeded draws, logprobs, and grammar masks (xgrammar)."""

from radixlm.runtime.sampling.sampler import Sampler, SamplingParams

__all__ = ["Sampler", "SamplingParams"]
