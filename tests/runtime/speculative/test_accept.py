"""Draft trees, the n-gram drafter, and acceptance: greedy matching and exact rejection
sampling (chi-square against the target distribution with a fixed seed)."""

from __future__ import annotations

import pytest
import torch

from radixlm.config import ServerArgs
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.request import Req
from radixlm.runtime.speculative.accept import accept_greedy, accept_sampled, target_probs
from radixlm.runtime.speculative.base import DraftContext, DraftTree
from radixlm.runtime.speculative.ngram import NgramDrafter


def test_trie_merges_shared_prefixes_breadth_first():
    t = DraftTree.from_sequences([[1, 2, 3], [1, 4], [5]], max_nodes=10)
    assert t.tokens == [1, 5, 2, 4, 3] and t.parents == [0, 0, 1, 1, 3]
    assert t.depths() == [0, 1, 1, 2, 2, 3]
    assert t.children() == [[1, 2], [3, 4], [], [5], [], []]
    mask = t.ancestor_mask()
    assert mask[5].tolist() == [True, True, False, True, False, True]
    assert DraftTree.from_sequences([[1, 2, 3], [1, 4], [5]], max_nodes=3).tokens == [1, 5, 2]


def test_ngram_proposes_most_recent_continuations():
    d = NgramDrafter(num_steps=3, topk=2)
    req = Req("r", [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3], SamplingParams())
    assert d.candidates(req) == [[5, 7, 2], [4, 9, 2]]
    req.output_ids.append(5)  # the index is extended incrementally
    assert d.candidates(req) == [[7, 2, 3]]
    assert d.candidates(Req("s", [8, 9], SamplingParams())) == []


def test_ngram_continues_a_repeating_tail_periodically():
    d = NgramDrafter(num_steps=5, topk=2)
    # (1, 2, 1, 2) last occurred ending two tokens back: period 2, drafted to depth 5.
    assert d.candidates(Req("r", [7, 1, 2, 1, 2, 1, 2], SamplingParams())) == [[1, 2, 1, 2, 1]]
    assert d.candidates(Req("s", [3, 3], SamplingParams())) == [[3, 3, 3, 3, 3]]
    # A match far enough back keeps the tokens that followed it.
    assert d.candidates(Req("t", [4, 5, 6, 7, 8, 9, 1, 4, 5], SamplingParams())) == [
        [6, 7, 8, 9, 1]
    ]


def test_ngram_available_counts_the_trie_that_draft_then_takes():
    d = NgramDrafter(num_steps=3, topk=2)
    req = Req("r", [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3], SamplingParams())
    none = Req("s", [8, 9], SamplingParams())
    assert d.available(req) == 6 and d.available(none) == 0  # [5, 7, 2] + [4, 9, 2]
    trees = d.draft(DraftContext([req, none], [4, 3], None))
    want = DraftTree.from_sequences([[5, 7, 2], [4, 9, 2]], 4)
    assert (trees[0].tokens, trees[0].parents) == (want.tokens, want.parents)
    assert len(trees[1]) == 0
    req.output_ids.append(5)  # a later step looks up afresh
    assert d.draft(DraftContext([req], [3], None))[0].tokens == [7, 2, 3]


def test_greedy_accepts_longest_matching_path_plus_bonus():
    tree = DraftTree([5, 6, 7], [0, 0, 1])  # root -> 5 -> 7, root -> 6
    assert accept_greedy(tree, [5, 7, 3, 1]) == ([0, 1, 3], 1)
    assert accept_greedy(tree, [6, 0, 2, 0]) == ([0, 2], 2)
    assert accept_greedy(tree, [9, 0, 0, 0]) == ([0], 9)


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_rejection_sampling_matches_target_joint_distribution():
    """Tree: root -> a (-> c), root -> b. Emitted (x, y) must follow p0(x) * p_x(y) where
    a second token exists exactly when x is a or b (a leaf's bonus)."""
    vocab, a, b, c = 6, 1, 3, 4
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, vocab, generator=gen) * 1.5  # nodes root, a, b, c
    tree = DraftTree([a, b, c], [0, 0, 1])
    params = SamplingParams(temperature=0.9, top_k=5)
    p = [target_probs(logits[i], params) for i in range(4)]
    # categories: (x, y) for x in {a, b}; (x, end) otherwise
    cats = {}
    for x in range(vocab):
        if x in (a, b):
            node = 1 if x == a else 2
            for y in range(vocab):
                cats[(x, y)] = float(p[0][x] * p[node][y])
        else:
            cats[(x, None)] = float(p[0][x])
    index = {k: i for i, k in enumerate(cats)}
    counts = torch.zeros(len(cats), dtype=torch.float64)
    rng = torch.Generator().manual_seed(1234)
    trials = 12000
    for _ in range(trials):
        path, bonus = accept_sampled(tree, logits, params, rng)
        toks = [tree.tokens[j - 1] for j in path[1:]] + [bonus]
        key = (toks[0], toks[1] if toks[0] in (a, b) else None)
        assert len(toks) == (2 if toks[0] in (a, b) else 1)
        counts[index[key]] += 1
    probs = torch.tensor(list(cats.values()), dtype=torch.float64)
    assert abs(float(probs.sum()) - 1) < 1e-6
    assert _chi2_pvalue(counts, probs) > 0.01
    # top_k=5 removed the least likely token at the root: never emitted first
    banned = int(torch.argmin(logits[0]))
    assert all(counts[index[k]] == 0 for k in cats if k[0] == banned)


def test_rejection_sampling_without_drafts_is_plain_sampling():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    params = SamplingParams(temperature=1.0)
    rng = torch.Generator().manual_seed(7)
    counts = torch.zeros(3, dtype=torch.float64)
    for _ in range(6000):
        path, bonus = accept_sampled(DraftTree(), logits, params, rng)
        assert path == [0]
        counts[bonus] += 1
    assert _chi2_pvalue(counts, torch.softmax(logits[0].double(), -1)) > 0.01


def test_seeded_leaf_draw_is_the_plain_samplers_draw():
    """With a seed, a bonus drawn where the tree has no candidates is the plain decode
    step's token for that (seed, position): a request that drafted nothing this step (its
    neighbours did) emits what a plain step would, whatever the other requests did."""
    from radixlm.runtime.sampling.sampler import Sampler

    torch.manual_seed(0)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    sampler = Sampler()
    for seed in range(40):
        logits = torch.randn(2, 50)
        req = Req("r", [1, 2, 3], params)
        req.seed, req.output_ids = seed, [4] * (seed % 5)
        want = int(sampler.sample(logits[:1], [req])[0])
        pos = len(req.output_ids)
        path, bonus = accept_sampled(DraftTree(), logits[:1], params, None, seed=seed, position=pos)
        assert (path, bonus) == ([0], want)
        # an accepted one-node chain: the bonus at its leaf is the draw one position on
        req.output_ids.append(0)
        want_next = int(sampler.sample(logits[1:], [req])[0])
        chain = DraftTree.chain([want])
        p0 = target_probs(logits[0], params)
        if float(p0[want]) > 0.05:  # accepted with probability p(want): retry until it is
            for k in range(400):
                g = torch.Generator().manual_seed(k)
                path, bonus = accept_sampled(chain, logits, params, g, seed=seed, position=pos)
                if path == [0, 1]:
                    assert bonus == want_next
                    break
            else:
                pytest.fail("the draft was never accepted")


def test_settings_are_checked():
    with pytest.raises(ValueError, match="speculative-draft-path"):
        ServerArgs(speculative_algorithm="eagle")
    with pytest.raises(ValueError, match="speculative_algorithm"):
        ServerArgs(speculative_algorithm="medusa")
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        ServerArgs(speculative_algorithm="ngram", speculative_num_draft_tokens=0)
