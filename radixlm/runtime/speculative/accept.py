"""Which draft tokens the target accepts: greedy matching and exact rejection sampling.

Greedy: walk from the root, at each node move to the child whose token equals the
target's argmax there; the first node without such a child contributes the argmax as
the bonus token. The emitted tokens are then exactly what greedy decoding would emit.

Sampling: multi-candidate speculative sampling (Leviathan et al. 2023, "Fast Inference
from Transformers via Speculative Decoding"; Chen et al. 2023; the tree form of Miao et
al. 2024, SpecInfer, and Li et al. 2024, EAGLE). Every drafter here proposes tokens
deterministically (a point-mass draft distribution q = delta(x) for each candidate x).
At a node with target distribution p and candidates x_1..x_m:

    for each x_i: accept with probability p(x_i) (u < p(x_i), u ~ U[0, 1));
                  on rejection p <- normalize(max(p - delta(x_i), 0)), i.e. p(x_i) <- 0
    if none is accepted: the bonus token is drawn from the last residual p.

Each candidate step is the standard accept/residual step with q = delta(x_i), so the
emitted token is distributed exactly as p (by induction over candidates), and the next
node is then processed with the target distribution conditioned on the accepted prefix.
p is the distribution the plain sampler draws from (temperature, top-k, top-p, min-p).
"""

from __future__ import annotations

import torch

from radixlm.runtime.sampling.random_draw import inverse_cdf_draw
from radixlm.runtime.sampling.sampler import Sampler, SamplingParams
from radixlm.runtime.speculative.base import DraftTree


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float64 [vocab] distribution the plain sampler would draw from for `logits`
    (float32 [vocab]) under `params` (temperature, then top-k / top-p / min-p)."""
    scaled = (logits / params.temperature)[None, :]
    return Sampler._filter(scaled, [params])[0].to(torch.float64)


def accept_greedy(tree: DraftTree, argmax: list[int]) -> tuple[list[int], int]:
    """Accepted path (node ids, root first) and the bonus token.

    Args:
        argmax: target argmax at nodes 0..n of the tree.
    """
    kids = tree.children()
    path, node = [0], 0
    while True:
        target = argmax[node]
        nxt = next((c for c in kids[node] if tree.tokens[c - 1] == target), None)
        if nxt is None:
            return path, target
        path.append(nxt)
        node = nxt


def accept_sampled(
    tree: DraftTree,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    seed: int | None = None,
    position: int = 0,
) -> tuple[list[int], int]:
    """Accepted path and bonus token by multi-candidate rejection sampling.

    Args:
        logits: float32 [n + 1, vocab] target logits at nodes 0..n.
        generator: the request's RNG (uniforms and residual draws come from it).
        seed, position: the request's seed and the output position of the root's token.
            With a seed, a bonus drawn at a node without candidates (where p is the
            untouched target distribution) uses the plain sampler's draw for (seed,
            position + depth) (`random_draw.inverse_cdf_draw`), so a request that drafted
            nothing this step gets exactly the token a plain decode step would give it.
    """
    kids = tree.children()
    depth = tree.depths()
    path, node = [0], 0
    while True:
        if not kids[node] and seed is not None:
            p = target_probs(logits[node], params)
            pos = torch.tensor([position + depth[node]], dtype=torch.int64)
            bonus = inverse_cdf_draw(p[None], torch.tensor([seed], dtype=torch.int64), pos)
            return path, int(bonus[0])
        p = target_probs(logits[node], params)
        nxt = None
        for c in kids[node]:
            tok = tree.tokens[c - 1]
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u < float(p[tok]):
                nxt = c
                break
            p[tok] = 0.0
            total = float(p.sum())
            if total <= 0.0:  # unreachable: p(tok) == 1 is always accepted
                break
            p /= total
        if nxt is None:
            bonus = int(torch.multinomial(p.to(torch.float32), 1, generator=generator)[0])
            return path, bonus
        path.append(nxt)
        node = nxt
