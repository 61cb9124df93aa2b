"""The engine's features over every model family (tiny random-weight configs from
transformers' own config classes): greedy output equals transformers token for token
with chunked prefill, page sizes 1 and 16, prefix-cache hits, retraction, parallel
siblings and speculation (n-gram and draft-model); logprobs equal transformers'
log-softmax; a grammar constrains every family the same way; the KV pool's accounting
holds afterwards; MoE models count their experts per decode step."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from radixlm import Engine
from radixlm.runtime.sched.decode import NormalDecode
from radixlm.runtime.speculative import make_speculative_decode
from tests.runtime.conftest import hf_greedy
from tests.tiny_models import TINY_FAMILIES, save_family_model, save_random_eagle_head

NEW = 10
# Short, repeated (n-gram drafts find matches), and longer than a sliding window.
PROMPTS = [
    [5, 17, 300, 4000, 9],
    [77, 78, 79, 80] * 6 + [123, 456],
    list(range(100, 160)),
    [5, 17, 300, 4000, 9, 11, 12],  # shares a prefix with the first
]


@pytest.fixture(scope="module", params=sorted(TINY_FAMILIES))
def family(request, tmp_path_factory, hf_dir):
    """(name, model dir, transformers model, greedy references of PROMPTS)."""
    path = tmp_path_factory.mktemp(request.param)
    model = save_family_model(request.param, path, hf_dir)
    refs = hf_greedy(model, PROMPTS, NEW, eos_token_id=None)
    return request.param, str(path), model, refs


def _greedy(n: int = NEW) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def _check_idle_pool(engine) -> None:
    mem = engine.get_server_info()["memory"]
    assert mem["free"] + mem["evictable"] + mem["protected"] + mem["held"] == mem["total"]
    assert mem["held"] == 0 and mem["protected"] == 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_chunked_prefill_and_cache_hits(family, page_size):
    _, path, _, refs = family
    with Engine(path, max_total_tokens=2048, page_size=page_size, chunked_prefill_size=7) as e:
        first = e.generate(input_ids=PROMPTS, sampling_params=_greedy())
        again = e.generate(input_ids=PROMPTS, sampling_params=_greedy())
        assert [o["output_ids"] for o in first] == refs
        assert [o["output_ids"] for o in again] == refs
        assert [o["usage"]["cached_tokens"] for o in again] == [
            (len(p) - 1) // page_size * page_size for p in PROMPTS
        ]
        _check_idle_pool(e)


def test_retraction_and_siblings(family):
    _, path, _, refs = family
    # 64 slots cannot hold every request's prompt and output at once: decode retracts.
    with Engine(path, max_total_tokens=64, schedule_conservativeness=0.3) as e:
        batch = [PROMPTS[0], PROMPTS[1], PROMPTS[3], PROMPTS[1], PROMPTS[1]]
        outs = e.generate(input_ids=batch, sampling_params=_greedy())
        assert [o["output_ids"] for o in outs] == [refs[0], refs[1], refs[3], refs[1], refs[1]]
        assert e.get_server_info()["scheduler"]["num_retracted_total"] > 0
        _check_idle_pool(e)


@pytest.mark.parametrize("algo", ["ngram", "draft"])
def test_speculation_equals_plain(family, algo):
    """n-gram drafts, and the model drafting for itself (every draft accepted): greedy
    output is the reference either way."""
    _, path, _, refs = family
    with Engine(path, max_total_tokens=2048, page_size=4) as e:
        sched = e.scheduler
        spec = {"speculative_draft_path": path} if algo == "draft" else {}
        args = dataclasses.replace(
            e.args, speculative_algorithm=algo, speculative_budget="fixed", **spec
        )
        sched.decoder = make_speculative_decode(args, e.runner)
        outs = e.generate(input_ids=PROMPTS, sampling_params=_greedy())
        assert [o["output_ids"] for o in outs] == refs
        stats = sched.stats()
        assert stats["spec_verify_steps_total"] > 0
        if algo == "draft":
            assert stats["spec_accepted_tokens_total"] == stats["spec_draft_tokens_total"] > 0
        sched.decoder = NormalDecode()
        _check_idle_pool(e)


def test_logprobs_match_transformers(family):
    _, path, model, refs = family
    ids = PROMPTS[1]
    with Engine(path, max_total_tokens=2048) as e:
        out = e.generate(
            input_ids=ids, sampling_params=_greedy(4), return_logprob=True, logprob_start_len=0
        )
    full = ids + out["output_ids"]
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
    meta = out["meta_info"]
    got = [v for v, _, _ in meta["input_token_logprobs"][1:]]
    want = [float(ref[k - 1, ids[k]]) for k in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3
    for j, (value, tok, _) in enumerate(meta["output_token_logprobs"]):
        assert abs(value - float(ref[len(ids) - 1 + j, tok])) < 1e-3


def test_grammar_constrains_every_family(family):
    _, path, _, _ = family
    params = {"max_new_tokens": 12, "temperature": 0, "regex": "(ab|cd)+x"}
    with (
        Engine(path, max_total_tokens=2048) as e,
        Engine(path, max_total_tokens=2048, page_size=16, chunked_prefill_size=3) as e2,
    ):
        a = e.generate(input_ids=PROMPTS[2], sampling_params=params)
        b = e2.generate(input_ids=PROMPTS[2], sampling_params=params)
    # A whole match, or (cut by max_new_tokens) a prefix of one.
    assert re.fullmatch("(ab|cd)+x|(ab|cd)*[ac]?", a["text"]), a["text"]
    assert a["output_ids"] == b["output_ids"]


def test_an_eagle_head_for_another_model_is_refused_at_start(family):
    _, path, _, _ = family
    with pytest.raises(ValueError, match="trained for 'smollm2-135m'.*hidden_size=576"):
        Engine(path, speculative_algorithm="eagle", speculative_draft_path="smollm2-135m")


def test_server_info_counts_distinct_experts_per_decode_step(family):
    name, path, _, _ = family
    with Engine(path, max_total_tokens=2048) as e:
        e.generate(input_ids=PROMPTS[0], sampling_params=_greedy())
        moe = e.get_server_info()["moe"]
    if not ("moe" in name or name == "mixtral" or name.startswith("deepseek")):
        assert moe is None
        return
    # One request: the prefill gives the first token, then NEW - 1 decode steps of batch
    # 1, each routing one token to exactly top_k distinct experts in every MoE layer.
    assert moe["distinct_experts_per_decode_step"] == {
        "1": {"steps": NEW - 1, "mean_per_layer": float(moe["top_k"])}
    }


def test_an_eagle_head_of_the_target_shape(family, tmp_path):
    """A random head shaped like the target, whatever the target's layers (its own layer
    is a plain pre-norm block): greedy output is the reference (acceptance does not matter
    for exactness)."""
    _, path, _, refs = family
    with Engine(path, max_total_tokens=2048, page_size=4) as e:
        head_dir = save_random_eagle_head(e.runner.model, path, tmp_path, 64)
        args = dataclasses.replace(
            e.args,
            speculative_algorithm="eagle",
            speculative_draft_path=head_dir,
            speculative_budget="fixed",
        )
        e.scheduler.decoder = make_speculative_decode(args, e.runner)
        outs = e.generate(input_ids=PROMPTS, sampling_params=_greedy())
        assert [o["output_ids"] for o in outs] == refs
        assert e.scheduler.stats()["spec_verify_steps_total"] > 0
        e.scheduler.decoder = NormalDecode()
        _check_idle_pool(e)
