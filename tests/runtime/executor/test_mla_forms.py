"""Multi-head latent attention's expanded form (`layers.mla_forms`): the same logits as
the absorbed form on EXTEND steps with and without a cached prefix, transformers' greedy
tokens with the expanded form forced on (chunked prefill, prefix-cache hits, page sizes 1
and 16), and the per-step cost rule at its stated crossover."""

from __future__ import annotations

import pytest
import torch

from radixlm import Engine
from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.runtime.executor.layers import mla_forms
from radixlm.runtime.executor.layers.mla_forms import MLAForms
from tests.runtime.conftest import hf_greedy
from tests.tiny_models import save_family_model

NEW = 8
PROMPTS = [
    [5, 17, 300, 4000, 9],
    list(range(100, 140)),
    [5, 17, 300, 4000, 9, 11, 12, 13, 14],  # shares a prefix with the first
]


@pytest.fixture(scope="module", params=["deepseek-v2", "deepseek-v3"])
def family(request, tmp_path_factory, hf_dir):
    """(model dir, greedy references of PROMPTS) of a tiny DeepSeek config."""
    path = tmp_path_factory.mktemp(request.param)
    model = save_family_model(request.param, path, hf_dir)
    return str(path), hf_greedy(model, PROMPTS, NEW, eos_token_id=None)


def _extend(runner, rows: list[int], prefix: list[list[int]], new: list[list[int]]):
    """An EXTEND ForwardBatch of requests in table rows `rows` whose cached prefix tokens
    are `prefix[b]` and new tokens `new[b]`, logits of every new token; request b's KV
    sits in slots 100 * (b + 1) onwards (written into the request-to-token table)."""
    table = runner.req_to_token_pool.req_to_token
    ids, pos, loc = [], [], []
    for b, (row, p, n) in enumerate(zip(rows, prefix, new)):
        slots = torch.arange(len(p) + len(n), dtype=table.dtype) + 100 * (b + 1)
        table[row, : len(slots)] = slots
        ids += n
        pos += range(len(p), len(p) + len(n))
        loc += slots[len(p) :].tolist()
    t = len(ids)
    return ForwardBatch(
        mode=ForwardMode.EXTEND,
        input_ids=torch.tensor(ids),
        positions=torch.tensor(pos),
        out_cache_loc=torch.tensor(loc),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor([len(p) + len(n) for p, n in zip(prefix, new)]),
        extend_prefix_lens=torch.tensor([len(p) for p in prefix]),
        extend_seq_lens=torch.tensor([len(n) for n in new]),
        req_to_token=table,
        logits_indices=torch.arange(t),
    )


@pytest.mark.parametrize("backend", ["cpu", "torch_native"])
def test_expanded_and_absorbed_forms_give_the_same_logits(family, backend):
    """A fresh prefill of two requests, then a second EXTEND step after their prefixes:
    every new token's fp32 logits agree to rounding between the two forms."""
    path, _ = family
    first = [list(range(200, 209)), list(range(300, 305))]
    second = [list(range(400, 406)), list(range(500, 511))]
    with Engine(path, max_total_tokens=1024, attention_backend=backend) as e:
        runner, forms = e.runner, e.runner.model.attention_forms
        logits = {}
        for mode in ("absorbed", "expanded"):
            forms.mode = mode
            a = runner.forward(_extend(runner, [0, 1], [[], []], first))
            b = runner.forward(_extend(runner, [0, 1], first, second))
            logits[mode] = (a, b)
    assert [x.shape[0] for x in logits["expanded"]] == [9 + 5, 6 + 11]
    for got, want in zip(logits["expanded"], logits["absorbed"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("page_size", [1, 16])
def test_forced_expanded_form_equals_transformers(family, page_size, monkeypatch):
    """Every EXTEND step in the expanded form (the backend's extend attention is never
    called), chunked prefill of 7 tokens, then the same prompts again from the prefix
    cache: transformers' greedy tokens."""
    path, refs = family
    calls = []
    attend = mla_forms.ExpandedStep.attend

    def counting(self, *args):
        calls.append(1)
        return attend(self, *args)

    monkeypatch.setattr(mla_forms.ExpandedStep, "attend", counting)
    params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(path, max_total_tokens=2048, page_size=page_size, chunked_prefill_size=7) as e:
        e.runner.model.attention_forms.mode = "expanded"

        def no_extend(*args):
            raise AssertionError("absorbed extend attention ran")

        e.runner.backend.forward_extend = no_extend
        first = e.generate(input_ids=PROMPTS, sampling_params=params)
        again = e.generate(input_ids=PROMPTS, sampling_params=params)
    assert [o["output_ids"] for o in first] == refs
    assert [o["output_ids"] for o in again] == refs
    assert [o["usage"]["cached_tokens"] for o in again] == [
        (len(p) - 1) // page_size * page_size for p in PROMPTS
    ]
    assert calls


def test_the_cost_rule_switches_at_its_crossover():
    """DeepSeek-V3's shape (R 512, Dn = Dv = 128): after a long prefix the expanded form
    wins from 171 new tokens on (n (2R - Dn - Dv) > R (Dn + Dv) up to the chunk's own
    pairs); a fresh prompt is expanded from one token on; a batch sums its requests."""
    forms = MLAForms(512, 128, 128)
    p = 10**6
    assert not forms.expanded_cheaper([170], [p])
    assert forms.expanded_cheaper([171], [p])
    assert forms.expanded_cheaper([1], [0])
    # A batch sums its requests: one long-prefix request outweighs a fresh prompt.
    assert forms.expanded_cheaper([1000], [0])
    assert not forms.expanded_cheaper([1000, 1], [0, 10 * p])
    assert forms.expanded_cheaper([1000, 1], [0, 1000])
    # 2R <= Dn + Dv: never cheaper, even without a prefix.
    assert not MLAForms(64, 64, 64).expanded_cheaper([100], [0])
    with pytest.raises(ValueError, match="'fast'"):
        forms.mode = "fast"
