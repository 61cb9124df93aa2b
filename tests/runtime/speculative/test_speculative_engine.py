"""Speculative decoding on the bundled model: greedy output equals the transformers
reference token for token with every drafter (single and batched, chains and trees,
chunked prefill, page size 4), stops inside an accepted run, short max_new_tokens,
retraction, aborts and the KV pool invariant.

One engine for the module; each test installs the decode strategy it needs
(`Scheduler.decoder`, normally fixed at construction) on an emptied cache.
"""

from __future__ import annotations

import dataclasses

import pytest

from radixlm import Engine
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.decode import NormalDecode
from radixlm.runtime.sched.request import Req
from radixlm.runtime.speculative import make_speculative_decode
from radixlm.runtime.speculative.budget import DraftBudget, FixedBudget
from radixlm.runtime.speculative.ngram import NgramDrafter
from tests.runtime.conftest import MAX_NEW, MODEL, greedy
from tests.runtime.sched_helpers import check_pool, make_req, run_all, step, tokens
from tests.tiny_models import save_random_eagle_head

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    with Engine(
        MODEL, max_total_tokens=6144, page_size=4, chunked_prefill_size=512,
        max_running_requests=16,
    ) as e:  # fmt: skip
        yield e


@pytest.fixture(scope="module")
def eagle_dir(engine, tmp_path_factory):
    """A randomly initialised EAGLE head (acceptance is irrelevant for exactness)."""
    out = tmp_path_factory.mktemp("eagle")
    return save_random_eagle_head(engine.runner.model, MODEL, out, 256)


def use(engine, algo: str | None, **spec) -> None:
    """Install a decode strategy on an idle engine with an empty cache (the fixed draft
    budget unless `spec` names one: every step where some request may draft verifies,
    whatever was measured)."""
    spec.setdefault("speculative_budget", "fixed")
    sched = engine.scheduler
    assert not sched.has_work()
    sched.tree.evict(sched.tree.evictable_size())
    if algo is None:
        sched.decoder = NormalDecode()
        return
    args = dataclasses.replace(
        engine.args, speculative_algorithm=algo, speculative_max_batch_size=16, **spec
    )
    sched.decoder = make_speculative_decode(args, engine.runner)


def spec_stats(engine) -> dict:
    return {k: v for k, v in engine.scheduler.stats().items() if k.startswith("spec_")}


CONFIGS = {
    "ngram-chain": ("ngram", {}),
    "ngram-tree": ("ngram", {"speculative_topk": 3, "speculative_num_draft_tokens": 6}),
    "draft-chain": ("draft", {"speculative_draft_path": MODEL}),
    "draft-tree": (
        "draft",
        {"speculative_draft_path": MODEL, "speculative_topk": 2, "speculative_num_draft_tokens": 6},
    ),  # fmt: skip
    "eagle-tree": ("eagle", {"speculative_topk": 2, "speculative_num_draft_tokens": 5}),
    "eagle-bundled": ("eagle", {"speculative_draft_path": MODEL}),  # the committed head
    # drafts only where measured cost and acceptance pay (the first step of each batch
    # size runs plain; with the target as its own draft, every later step drafts)
    "ngram-goodput": ("ngram", {"speculative_budget": "goodput"}),
    "draft-goodput": ("draft", {"speculative_draft_path": MODEL, "speculative_budget": "goodput"}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_reference(name, engine, eagle_dir, prompts, reference):
    algo, spec = CONFIGS[name]
    if algo == "eagle" and "speculative_draft_path" not in spec:
        spec = {**spec, "speculative_draft_path": eagle_dir}
    spec = {"speculative_budget": "fixed", **spec}
    use(engine, algo, **spec)
    batched = engine.generate(input_ids=prompts, sampling_params=greedy())
    assert [o["output_ids"] for o in batched] == reference
    engine.scheduler.tree.evict(engine.scheduler.tree.evictable_size())
    for ids, ref in zip(prompts[:4], reference[:4]):  # single requests
        assert engine.generate(input_ids=ids, sampling_params=greedy())["output_ids"] == ref
    assert all(o["spec_accept_length"] >= 1.0 for o in batched)  # per-request meta info
    stats = spec_stats(engine)
    if spec["speculative_budget"] == "fixed":
        # plain steps only where no request may draft (a last token)
        assert stats["spec_verify_steps_total"] > stats["spec_plain_decode_steps_total"]
    else:
        # the goodput budget prices drafts from step times measured in this run, so how
        # many steps it drafts depends on the machine's load; it drafts once priced
        assert stats["spec_verify_steps_total"] >= 1
    if name == "draft-chain":  # the target drafting for itself: every draft is accepted
        assert stats["spec_accept_rate"] == 1.0
        assert stats["spec_accept_length"] > 3.0
    if name == "eagle-bundled":  # the trained head drafts better than chance
        assert stats["spec_accept_length"] > 1.1  # 1.19 measured
    check_pool(engine.scheduler, idle=True)


class _CapBudget(FixedBudget):
    """Drafts every cap, cut to what the drafter has (as the goodput budget plans, but
    independent of timing)."""

    within_available = True


def test_ngram_verifies_only_where_its_lookup_found_a_continuation(engine):
    """A budget planning `within_available` drafts only what the n-gram lookup has
    (`Drafter.available`): a step where it found nothing runs plain. Replays the greedy
    output: a step without a match emits one token; a step with one verifies the
    continuation, emitting its matching prefix and the bonus token."""
    use(engine, "ngram")
    engine.scheduler.decoder.budget = _CapBudget()
    prompt = [(7919 * i) % 40000 + 100 for i in range(1, 41)]  # 40 distinct ids
    params = {**greedy(24), "ignore_eos": True}
    ids = prompt + engine.generate(input_ids=prompt, sampling_params=params)["output_ids"]
    lookup = NgramDrafter(num_steps=4, topk=1)
    pos, plain, verify = len(prompt) + 1, 0, 0  # the prefill emitted the first token
    while pos < len(ids):
        cap = min(4, len(ids) - pos - 1)  # --speculative-num-draft-tokens, tokens left
        found = lookup.candidates(Req("replay", ids[:pos], SamplingParams())) if cap else []
        if not found:
            plain, pos = plain + 1, pos + 1
            continue
        draft, k = found[0][:cap], 0
        while k < len(draft) and draft[k] == ids[pos + k]:
            k += 1
        verify, pos = verify + 1, pos + k + 1
    assert plain >= 2 and verify >= 1  # the prompt has steps of both kinds
    stats = spec_stats(engine)
    assert stats["spec_plain_decode_steps_total"] == plain
    assert stats["spec_verify_steps_total"] == verify
    check_pool(engine.scheduler, idle=True)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_short_max_new_tokens(n, engine, prompts, reference):
    use(engine, "draft", speculative_draft_path=MODEL, speculative_num_draft_tokens=4)
    outs = engine.generate(input_ids=prompts[:3], sampling_params=greedy(n))
    for out, ref in zip(outs, reference):
        assert out["output_ids"] == ref[:n]
        assert out["finish_reason"] == "length" and out["usage"]["completion_tokens"] == n


def test_stops_inside_accepted_run(engine, prompts, reference, tokenizer):
    """With full acceptance (self-draft, 4 tokens per step), stop tokens and strings that
    land mid-block end the request at that token; nothing after it is emitted."""
    use(engine, "draft", speculative_draft_path=MODEL, speculative_num_draft_tokens=4)
    ref = reference[0]
    stop_at = 6  # completion token index 6: inside the second accepted block (1 + 5 + ...)
    out = engine.generate(
        input_ids=prompts[0],
        sampling_params={**greedy(), "stop_token_ids": [ref[stop_at]]},
    )
    first = ref.index(ref[stop_at])
    assert out["output_ids"] == ref[: first + 1]
    assert out["finish_reason"] == "stop" and out["matched_stop"] == ref[stop_at]
    assert out["usage"]["completion_tokens"] == first + 1
    # a stop string completed by token 7 of the reference
    text7 = tokenizer.decode(ref[:8])
    stop = text7[len(tokenizer.decode(ref[:7])) - 2 :].strip() or text7[-3:]
    out = engine.generate(input_ids=prompts[0], sampling_params={**greedy(), "stop": [stop]})
    k = next(i for i in range(1, len(ref) + 1) if stop in tokenizer.decode(ref[:i]))
    assert out["output_ids"] == ref[:k] and out["finish_reason"] == "stop"
    assert out["matched_stop"] == stop and stop not in out["text"]


def test_eos_inside_accepted_run(engine, tokenizer):
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Reply with the single word: yes"}],
        tokenize=True, add_generation_prompt=True, return_dict=False,
    )  # fmt: skip
    use(engine, None)
    plain = engine.generate(input_ids=chat, sampling_params=greedy(40))
    assert plain["finish_reason"] == "stop" and plain["output_ids"][-1] == 2  # <|im_end|>
    use(engine, "draft", speculative_draft_path=MODEL, speculative_num_draft_tokens=4)
    out = engine.generate(input_ids=chat, sampling_params=greedy(40))
    assert out["output_ids"] == plain["output_ids"]
    assert out["finish_reason"] == "stop" and out["matched_stop"] == 2
    assert out["usage"]["completion_tokens"] == len(plain["output_ids"])


def test_aborts_keep_pool_invariant(engine, prompts, reference):
    use(engine, "ngram", speculative_topk=2, speculative_num_draft_tokens=6)
    sched = engine.scheduler
    reqs = [make_req(prompts[i], 24, ignore_eos=True) for i in range(5)]
    keep = make_req(prompts[0], MAX_NEW)
    for r in reqs + [keep]:
        sched.add_request(r)
    outs: dict = {}
    for _ in range(4):
        step(sched, outs)
        check_pool(sched, idle=False)
    assert sched.abort(reqs[1].rid) and sched.abort(reqs[3].rid)
    check_pool(sched, idle=False)
    step(sched, outs)
    assert sched.abort(reqs[4].rid)
    run_all(sched, outs)
    check_pool(sched, idle=True)
    assert tokens(outs[keep.rid]) == reference[0]
    for r in (reqs[1], reqs[3], reqs[4]):
        assert outs[r.rid][-1].finish_reason == "abort"


def test_retraction_with_speculation(engine, prompts):
    """A pool too small for every request: drafts shrink, requests retract and resume,
    and the outputs still equal plain decoding."""
    which, new = [0, 1, 2, 3, 4], 40
    use(engine, None)
    plain = engine.generate(input_ids=[prompts[i] for i in which],
                            sampling_params={**greedy(new), "ignore_eos": True})  # fmt: skip
    use(engine, "draft", speculative_draft_path=MODEL, speculative_num_draft_tokens=4)
    sched = engine.scheduler
    keep_free = 160  # the five requests need about 5 * (10 + 40) slots
    stolen = sched.allocator.alloc_pages((sched.allocator.available() - keep_free) // 4)
    try:
        before = sched.counters.retracted
        outs = engine.generate(input_ids=[prompts[i] for i in which],
                               sampling_params={**greedy(new), "ignore_eos": True})  # fmt: skip
        assert sched.counters.retracted > before
    finally:
        sched.tree.evict(sched.tree.evictable_size())
        sched.allocator.free(stolen * 4)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in plain]
    check_pool(sched, idle=True)


def test_sampled_requests_are_seeded_and_complete(engine, prompts):
    """Sampling goes through rejection sampling: a seed reproduces the output exactly."""
    use(engine, "draft", speculative_draft_path=MODEL, speculative_topk=2,
        speculative_num_draft_tokens=5)  # fmt: skip
    params = {"max_new_tokens": 20, "temperature": 0.8, "top_p": 0.9, "seed": 11,
              "ignore_eos": True}  # fmt: skip
    a = engine.generate(input_ids=prompts[:3], sampling_params=params)
    b = engine.generate(input_ids=prompts[:3], sampling_params=params)
    assert [o["output_ids"] for o in a] == [o["output_ids"] for o in b]
    assert all(len(o["output_ids"]) == 20 for o in a)
    # The draft is the target itself, but a top-2 tree proposes two children per node and
    # at most one can be accepted, so the rate stays well below 1 (about 0.3 here).
    assert spec_stats(engine)["spec_accept_rate"] > 0.2
    check_pool(engine.scheduler, idle=True)


class _GreedyOnlyBudget(DraftBudget):
    """Drafts the cap for greedy requests only (or for nobody): what a timing-driven
    budget may do to a seeded request's neighbours."""

    def __init__(self, draft: bool):
        self.draft = draft

    def plan(self, reqs, caps):
        return [c if self.draft and r.params.is_greedy else 0 for r, c in zip(reqs, caps)]


def test_seeded_output_does_not_depend_on_neighbours_drafts(engine, prompts):
    """A seeded sampled request that drafts nothing gets, at every step, the plain
    sampler's draw, whether the step ran plain (nobody drafted) or verified the drafts of
    a greedy neighbour: the same output as without speculation."""
    seeded = {"max_new_tokens": 8, "temperature": 0.9, "top_p": 0.95, "seed": 5,
              "ignore_eos": True}  # fmt: skip
    params = [seeded, greedy(8)]
    outs = {}
    for name, draft in (("plain", None), ("nobody drafts", False), ("greedy drafts", True)):
        use(engine, None if draft is None else "draft", speculative_draft_path=MODEL)
        if draft is not None:
            engine.scheduler.decoder.budget = _GreedyOnlyBudget(draft)
        got = engine.generate(input_ids=prompts[:2], sampling_params=params)
        outs[name] = [o["output_ids"] for o in got]
    assert spec_stats(engine)["spec_verify_steps_total"] > 0  # the last run verified drafts
    assert outs["nobody drafts"] == outs["plain"]
    assert outs["greedy drafts"] == outs["plain"]
    check_pool(engine.scheduler, idle=True)
