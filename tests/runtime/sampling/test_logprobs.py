"""Engine logprobs (meta_info) against a transformers forward pass; cache hit vs miss,
chunked prefill, prompt scoring; penalties, min_new_tokens and no_stop_trim end to end."""

from __future__ import annotations

import pytest
import torch

from radixlm import Engine
from tests.runtime.conftest import MODEL, greedy

PROMPT = "The capital of France is Paris. The capital of Italy is"
TOL = 1e-4


@pytest.fixture(scope="module")
def engine():
    with Engine(MODEL, max_total_tokens=4096, context_length=512) as e:
        yield e


@pytest.fixture(scope="module")
def hf_logprobs(hf_dir):
    """log_softmax of a transformers fp32 forward over a token sequence: [len, vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()

    def run(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, -1)

    return run


def _values(entries) -> list:
    return [e[0] for e in entries]


def test_logprobs_match_transformers(engine, tokenizer, hf_logprobs):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    engine.flush_cache()
    out = engine.generate(
        input_ids=ids,
        sampling_params=greedy(6),
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
        return_text_in_logprobs=True,
    )
    meta = out["meta_info"]
    full = ids + out["output_ids"]
    ref = hf_logprobs(full)  # row p predicts token p + 1
    inp = meta["input_token_logprobs"]
    assert (
        [e[1] for e in inp] == ids and inp[0][0] is None and meta["input_top_logprobs"][0] is None
    )
    for k in range(1, len(ids)):
        assert abs(inp[k][0] - float(ref[k - 1, ids[k]])) < TOL
        assert inp[k][2] == tokenizer.decode([ids[k]])
    outp = meta["output_token_logprobs"]
    assert [e[1] for e in outp] == out["output_ids"]
    for j, (value, tok, _) in enumerate(outp):
        row = ref[len(ids) - 1 + j]
        assert abs(value - float(row[tok])) < TOL
        top = meta["output_top_logprobs"][j]
        vals, best = torch.topk(row, 3)
        assert [t[1] for t in top] == best.tolist()
        assert max(abs(a[0] - float(b)) for a, b in zip(top, vals)) < TOL
        assert top[0][1] == tok  # greedy picks the most likely token


def test_token_ids_logprob_match_transformers(engine, tokenizer, hf_logprobs):
    """token_ids_logprob: the asked ids' logprobs at every prompt and output position, in
    the asked order; with max_new_tokens 0 the output list is the next position's."""
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    asked = [ids[1], 7, ids[-1], 0]
    engine.flush_cache()
    out = engine.generate(
        input_ids=ids,
        sampling_params=greedy(3),
        return_logprob=True,
        logprob_start_len=len(ids) - 3,
        token_ids_logprob=asked,
        return_text_in_logprobs=True,
    )
    meta = out["meta_info"]
    ref = hf_logprobs(ids + out["output_ids"])  # row p predicts token p + 1
    inp, outp = meta["input_token_ids_logprobs"], meta["output_token_ids_logprobs"]
    assert len(inp) == 3 and len(outp) == 3
    for rows, first in ((inp, len(ids) - 4), (outp, len(ids) - 1)):
        for j, entries in enumerate(rows):
            assert [e[1] for e in entries] == asked
            assert [e[2] for e in entries] == [tokenizer.decode([t]) for t in asked]
            want = ref[first + j, asked]
            assert max(abs(e[0] - float(w)) for e, w in zip(entries, want)) < TOL
    zero = engine.generate(
        input_ids=[ids, ids],
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        token_ids_logprob=[asked, None],
    )
    assert zero[0]["meta_info"]["output_token_logprobs"] == []
    (next_position,) = zero[0]["meta_info"]["output_token_ids_logprobs"]
    assert [e[0] for e in next_position] == pytest.approx(
        ref[len(ids) - 1, asked].tolist(), abs=TOL
    )
    assert "output_token_ids_logprobs" not in zero[1]["meta_info"]
    streamed = list(
        engine.generate(
            input_ids=ids,
            sampling_params=greedy(3),
            stream=True,
            return_logprob=True,
            token_ids_logprob=asked,
        )
    )
    joined = [p for c in streamed for p in c["meta_info"].get("output_token_ids_logprobs", [])]
    assert [e[1] for p in joined for e in p] == [e[1] for p in outp for e in p]
    assert [e[0] for p in joined for e in p] == pytest.approx(
        [e[0] for p in outp for e in p], abs=TOL
    )


def test_cache_hit_and_miss_give_the_same_values(engine, tokenizer):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    kw = dict(return_logprob=True, top_logprobs_num=2)
    engine.flush_cache()
    miss = engine.generate(input_ids=ids, sampling_params=greedy(4), logprob_start_len=0, **kw)
    assert miss["usage"]["cached_tokens"] == 0
    # The prompt is cached now; prompt logprobs still cover every token.
    hit = engine.generate(input_ids=ids, sampling_params=greedy(4), logprob_start_len=0, **kw)
    _same(hit["meta_info"], miss["meta_info"])
    # From position 5: the cache serves the first 4 tokens, logprobs start at token 5.
    part = engine.generate(input_ids=ids, sampling_params=greedy(4), logprob_start_len=5, **kw)
    assert part["usage"]["cached_tokens"] == 4
    inp = part["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in inp] == ids[5:]
    ref = miss["meta_info"]["input_token_logprobs"][5:]
    assert max(abs(a[0] - b[0]) for a, b in zip(inp, ref)) < TOL
    # Without prompt logprobs the whole prompt but its last token is a cache hit.
    plain = engine.generate(input_ids=ids, sampling_params=greedy(4), **kw)
    assert plain["usage"]["cached_tokens"] == len(ids) - 1
    assert plain["meta_info"]["input_token_logprobs"] == []
    _same_entries(
        plain["meta_info"]["output_token_logprobs"], miss["meta_info"]["output_token_logprobs"]
    )


def test_chunked_mixed_prefill_gives_the_same_logprobs(engine, tokenizer):
    ids = tokenizer.encode(PROMPT * 3, add_special_tokens=False)
    engine.flush_cache()
    whole = engine.generate(
        input_ids=ids, sampling_params=greedy(2), return_logprob=True, logprob_start_len=0
    )
    other = tokenizer.encode("Hello there", add_special_tokens=False)
    with Engine(
        MODEL,
        max_total_tokens=4096,
        context_length=512,
        chunked_prefill_size=7,
        enable_mixed_chunk=True,
    ) as e:
        # The short request decodes inside the long prompt's chunked extend steps.
        outs = e.generate(
            input_ids=[other, ids],
            sampling_params=[greedy(12), greedy(2)],
            return_logprob=[False, True],
            logprob_start_len=[-1, 0],
        )
    assert "input_token_logprobs" not in outs[0]["meta_info"]
    _same(outs[1]["meta_info"], whole["meta_info"])


def test_n_copies_share_the_prompt(engine, tokenizer):
    ids = tokenizer.encode(PROMPT * 3, add_special_tokens=False)
    engine.flush_cache()
    sampled = {"max_new_tokens": 4, "temperature": 1.0}
    outs = engine.generate(input_ids=[ids] * 3, sampling_params=sampled)
    # The in-batch prefix guard holds copies 1 and 2 back one step: they hit copy 0's KV.
    assert [o["usage"]["cached_tokens"] for o in outs] == [0, len(ids) - 1, len(ids) - 1]


def test_max_new_tokens_zero_scores_the_prompt(engine, tokenizer):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    out = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
    )
    meta = out["meta_info"]
    assert out["output_ids"] == [] and out["finish_reason"] == "length"
    assert len(meta["input_token_logprobs"]) == len(ids) and meta["output_token_logprobs"] == []
    assert all(v < 0 for v in _values(meta["input_token_logprobs"])[1:])


def test_streamed_logprobs_concatenate_to_the_full_result(engine):
    kw = dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=1)
    full = engine.generate(PROMPT, greedy(5), **kw)
    chunks = list(engine.generate(PROMPT, greedy(5), stream=True, **kw))
    out_entries = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    _same_entries(out_entries, full["meta_info"]["output_token_logprobs"])
    in_entries = [e for c in chunks for e in c["meta_info"]["input_token_logprobs"]]
    _same_entries(in_entries, full["meta_info"]["input_token_logprobs"])
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_no_logprobs_requested_means_empty_meta_lists(engine):
    out = engine.generate(PROMPT, greedy(3))
    assert "input_token_logprobs" not in out["meta_info"]
    assert out["meta_info"]["completion_tokens"] == 3


def test_penalties_min_new_tokens_and_no_stop_trim(engine):
    base = engine.generate(PROMPT, greedy(16))
    penal = engine.generate(PROMPT, {**greedy(16), "frequency_penalty": 2.0})
    # Frequency penalty 2 forbids repeating a token whose logit lead is small.
    assert len(set(penal["output_ids"])) >= len(set(base["output_ids"]))
    bias = base["output_ids"][0]
    biased = engine.generate(PROMPT, {**greedy(4), "logit_bias": {bias: -100.0}})
    assert bias not in biased["output_ids"]
    eos_first = engine.generate(PROMPT, {**greedy(8), "logit_bias": {2: 100.0}})
    assert eos_first["output_ids"] == [2] and eos_first["finish_reason"] == "stop"
    held = engine.generate(PROMPT, {**greedy(8), "logit_bias": {2: 100.0}, "min_new_tokens": 3})
    assert len(held["output_ids"]) == 4 and held["output_ids"][-1] == 2
    stop = base["text"][3:9]
    trimmed = engine.generate(PROMPT, {**greedy(16), "stop": [stop]})
    kept = engine.generate(PROMPT, {**greedy(16), "stop": [stop], "no_stop_trim": True})
    assert trimmed["text"] == base["text"][:3]
    assert kept["text"] == base["text"][:9]
    assert kept["output_ids"] == trimmed["output_ids"]


def test_logprob_option_validation(engine):
    from radixlm.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        engine.generate(PROMPT, greedy(2), return_logprob=True, logprob_start_len=-2)
    with pytest.raises(InvalidRequestError):
        engine.generate(PROMPT, greedy(2), return_logprob=True, top_logprobs_num=-1)
    with pytest.raises(InvalidRequestError):
        engine.generate(PROMPT, {**greedy(2), "logit_bias": {10**6: 1.0}})
    for bad in ([10**6], [-1], ["7"], [True], 5):
        with pytest.raises(InvalidRequestError) as e:
            engine.generate(PROMPT, greedy(2), return_logprob=True, token_ids_logprob=bad)
        assert e.value.param == "token_ids_logprob"
    with pytest.raises(InvalidRequestError):  # one list per prompt: two for one prompt
        engine.generate(PROMPT, greedy(2), return_logprob=True, token_ids_logprob=[[1], [2]])


def _same_entries(a, b) -> None:
    assert [e[1] for e in a] == [e[1] for e in b]
    for x, y in zip(a, b):
        assert (x[0] is None) == (y[0] is None)
        if x[0] is not None:
            assert abs(x[0] - y[0]) < TOL


def _same(a: dict, b: dict) -> None:
    _same_entries(a["input_token_logprobs"], b["input_token_logprobs"])
    _same_entries(a["output_token_logprobs"], b["output_token_logprobs"])


def test_retraction_keeps_logprobs_exact(engine, prompts):
    """A 96-slot pool retracts decoding requests; resumed requests neither repeat nor lose
    logprob entries, and the values equal an unpressured run's."""
    short = [prompts[i] for i in (0, 1, 2, 3, 4, 6, 7)]
    kw = dict(sampling_params=greedy(), return_logprob=True, logprob_start_len=0)
    engine.flush_cache()
    calm = engine.generate(input_ids=short, **kw)
    with Engine(MODEL, max_total_tokens=96, schedule_conservativeness=0.3) as tight:
        pressed = tight.generate(input_ids=short, **kw)
        assert tight.get_server_info()["scheduler"]["num_retracted_total"] > 0
    for a, b, ids in zip(pressed, calm, short):
        assert a["output_ids"] == b["output_ids"]
        assert len(a["meta_info"]["input_token_logprobs"]) == len(ids)
        assert len(a["meta_info"]["output_token_logprobs"]) == len(a["output_ids"])
        _same(a["meta_info"], b["meta_info"])


def test_grammar_constrained_logprobs_are_raw(engine):
    """A grammar masks the sampler's logits, not the reported logprobs: the model's own
    top token (outside the grammar) still leads the top list."""
    out = engine.generate(
        PROMPT,
        {**greedy(4), "regex": "(red|green|blue)"},
        return_logprob=True,
        top_logprobs_num=1,
        return_text_in_logprobs=True,
    )
    assert out["text"] in ("red", "green", "blue")
    meta = out["meta_info"]
    first_value, first_tok, _ = meta["output_token_logprobs"][0]
    top_value, top_tok, top_text = meta["output_top_logprobs"][0][0]
    assert top_text not in ("red", "green", "blue") and top_tok != first_tok
    assert first_value < top_value
