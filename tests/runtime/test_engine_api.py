"""Engine API behaviour: streaming, sampling seeds, stop conditions, abort, bad input."""

from __future__ import annotations

import pytest

from radixlm import Engine, SamplingParams
from radixlm.errors import InvalidRequestError, ModelNotFoundError
from tests.runtime.conftest import MODEL, greedy

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def engine():
    with Engine(MODEL, max_total_tokens=4096, context_length=512) as e:
        yield e


def _idle(engine: Engine) -> dict:
    mem = engine.get_server_info()["memory"]
    assert mem["free"] + mem["evictable"] + mem["protected"] + mem["held"] == mem["total"]
    assert mem["held"] == 0 and mem["protected"] == 0
    return mem


def test_stream_concatenates_to_full_text(engine):
    full = engine.generate(PROMPT, greedy(24))
    chunks = list(engine.generate(PROMPT, greedy(24), stream=True))
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert [t for c in chunks for t in c["output_ids"]] == full["output_ids"]
    assert chunks[-1]["finish_reason"] == "length"
    assert all("finish_reason" not in c for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 24


def test_stream_of_batch_carries_index(engine):
    prompts = [PROMPT, "The capital of France is"]
    full = engine.generate(prompts, greedy(8))
    chunks = list(engine.generate(prompts, greedy(8), stream=True))
    for i, ref in enumerate(full):
        mine = [c for c in chunks if c["index"] == i]
        assert "".join(c["text"] for c in mine) == ref["text"]


def test_closing_a_stream_aborts_and_frees(engine):
    it = engine.generate(PROMPT, greedy(64), stream=True)
    next(it)
    next(it)
    it.close()
    assert engine.get_server_info()["num_running"] == 0
    _idle(engine)


def test_seed_reproducible_also_in_a_batch(engine):
    sampled = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 7}
    alone = engine.generate(PROMPT, sampled)
    batch = engine.generate(
        [PROMPT, "Hello there", PROMPT], [sampled, greedy(16), {**sampled, "seed": 8}]
    )
    assert batch[0]["output_ids"] == alone["output_ids"]
    assert batch[2]["output_ids"] != alone["output_ids"]


def test_stop_token_ids_and_max_new_tokens(engine):
    ref = engine.generate(PROMPT, greedy(12))["output_ids"]
    stop = ref[5]
    first = ref.index(stop)
    out = engine.generate(PROMPT, {**greedy(12), "stop_token_ids": [stop]})
    assert out["output_ids"] == ref[: first + 1]
    assert out["finish_reason"] == "stop" and out["matched_stop"] == stop
    # the matched stop token's text is left out, as SGLang trims it
    assert out["text"] == engine.tokenizer.decode(ref[:first], skip_special_tokens=True)
    short = engine.generate(PROMPT, greedy(3))
    assert short["output_ids"] == ref[:3] and short["finish_reason"] == "length"


def test_eos_stops_unless_ignored(engine):
    chat = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], tokenize=False, add_generation_prompt=True
    )
    out = engine.generate(chat, greedy(200))
    assert out["finish_reason"] == "stop" and out["matched_stop"] == 2
    assert out["output_ids"][-1] == 2 and 2 not in out["output_ids"][:-1]
    n = len(out["output_ids"])
    more = engine.generate(chat, {**greedy(n + 3), "ignore_eos": True})
    assert more["output_ids"][:n] == out["output_ids"]
    assert len(more["output_ids"]) == n + 3 and more["finish_reason"] == "length"


def test_max_new_tokens_zero_caches_the_prompt(engine):
    ids = engine.tokenizer.encode("A unique prefix about owls and moons, " * 4)
    out = engine.generate(input_ids=ids, sampling_params=greedy(0))
    assert out["output_ids"] == [] and out["finish_reason"] == "length"
    again = engine.generate(input_ids=ids + [13], sampling_params=greedy(1))
    assert again["usage"]["cached_tokens"] == len(ids)


def test_context_length_stops_generation(engine):
    ids = engine.tokenizer.encode("word " * 505)[:505]
    out = engine.generate(input_ids=ids, sampling_params={**greedy(50), "ignore_eos": True})
    assert out["finish_reason"] == "length"
    assert len(ids) + len(out["output_ids"]) == 512


def test_sampling_params_object_and_dict_agree(engine):
    a = engine.generate(PROMPT, SamplingParams(max_new_tokens=5, temperature=0))
    b = engine.generate(PROMPT, {"max_new_tokens": 5, "temperature": 0})
    assert a["output_ids"] == b["output_ids"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": ""}, "empty prompt"),
        ({"input_ids": []}, "empty prompt list"),
        ({"prompt": ["ok", ""]}, "empty prompt"),
        ({"input_ids": [1] * 600}, "context length is 512"),
        ({"input_ids": [49152]}, "token ids must be in"),
        ({"prompt": PROMPT, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"prompt": PROMPT, "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"prompt": PROMPT, "sampling_params": {"top_p": 0}}, "top_p"),
        ({"prompt": PROMPT, "sampling_params": {"max_tokens": 3}}, "unknown sampling"),
        ({"prompt": PROMPT, "sampling_params": {"max_new_tokens": "x"}}, "invalid sampling"),
        ({"prompt": 42}, "prompt must be"),
        ({"input_ids": "hello"}, "input_ids must be a list"),
        ({"input_ids": [True, False]}, "a prompt must be"),
        ({"prompt": PROMPT, "sampling_params": {"temperature": float("nan")}}, "finite"),
        ({"prompt": PROMPT, "sampling_params": {"seed": 2**64}}, "seed must be"),
        ({"prompt": PROMPT, "sampling_params": {"max_new_tokens": 3.5}}, "Expected `int`"),
        ({"prompt": PROMPT, "sampling_params": {"stop_token_ids": [-1]}}, "stop_token_ids"),
        ({"prompt": PROMPT, "sampling_params": SamplingParams(stop_token_ids=None)}, "array"),
        ({}, "exactly one of"),
        (
            {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 3},
            "past the prompt's last position",
        ),
    ],
)
def test_bad_input_raises_typed_error_and_engine_keeps_serving(engine, kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.generate(**kwargs)
    assert engine.generate(PROMPT, greedy(2))["output_ids"]
    _idle(engine)


def test_request_that_cannot_fit_the_pool_is_rejected():
    with Engine(MODEL, max_total_tokens=64) as small:
        with pytest.raises(InvalidRequestError, match="cannot fit the KV cache"):
            small.generate(PROMPT, greedy(100))
        assert len(small.generate(PROMPT, greedy(8))["output_ids"]) == 8


def test_unknown_model_is_a_typed_error():
    with pytest.raises(ModelNotFoundError, match="unknown model 'no-such-model'"):
        Engine("no-such-model")


def test_unknown_engine_argument():
    with pytest.raises(TypeError, match="unknown Engine arguments"):
        Engine(MODEL, max_tokens_total=5)


def test_streams_consumed_alternately_lose_nothing(engine):
    a_ref, b_ref = engine.generate([PROMPT, "The capital of France is"], greedy(10))
    a = engine.generate(PROMPT, greedy(10), stream=True)
    b = engine.generate("The capital of France is", greedy(10), stream=True)
    first_b = next(b)
    first_a = next(a)
    rest_a = list(a)  # drives b's request to completion while b is suspended
    rest_b = list(b)
    assert "".join(c["text"] for c in [first_a, *rest_a]) == a_ref["text"]
    assert "".join(c["text"] for c in [first_b, *rest_b]) == b_ref["text"]
    assert rest_b[-1]["finish_reason"] == "length"
    _idle(engine)


def test_blocking_generate_inside_a_stream_loop(engine):
    ref = engine.generate(PROMPT, greedy(6))
    texts = []
    for chunk in engine.generate(PROMPT, greedy(6), stream=True):
        texts.append(chunk["text"])
        if len(texts) == 1:
            assert engine.generate("Hi", greedy(3))["usage"]["completion_tokens"] == 3
    assert "".join(texts) == ref["text"]
    _idle(engine)


def test_server_info_says_which_paths_were_chosen(engine):
    from radixlm import omp_policy
    from radixlm.kernels.cpu import CpuKernels

    info = engine.get_server_info()
    assert info["args"]["attention_backend"] == "auto" and info["args"]["cpu_gemm"] == "auto"
    built = CpuKernels.load() is not None
    assert info["resolved"] == {
        "device": "cpu",
        "attention_backend": "CpuNativeBackend" if built else "TorchNativeBackend",
        "cpu_layout": "packed" if built else "input-major",
        # the bundled GGUF's Q4_1 / Q8_0 blocks: 30 layers x 4 fused projections + the head
        "weight_format": "gguf" if built else None,
        "quantized_weights": 121 if built else 0,
        "kv_cache_dtype": "float32",
        "kv_scales": None,
        "omp_wait_policy": omp_policy.describe(),
    }
    with Engine(MODEL, max_total_tokens=256, cpu_gemm="torch") as ref:
        resolved = ref.get_server_info()["resolved"]
    assert resolved["cpu_layout"] == "input-major" and resolved["weight_format"] is None
    assert resolved["quantized_weights"] == 0


def _drive(engine: Engine) -> dict[str, list[dict]]:
    """Step until every add_request request has finished; chunks per request id."""
    chunks: dict[str, list[dict]] = {}
    while engine.has_unfinished_requests():
        for chunk in engine.step():
            assert "index" not in chunk
            chunks.setdefault(chunk["rid"], []).append(chunk)
    return chunks


def test_step_driven_requests_equal_generate(engine):
    second = "The capital of France is"
    ref_a, ref_b = engine.generate([PROMPT, second], greedy(10))
    a = engine.add_request(PROMPT, greedy(10))
    assert engine.get_server_info()["num_waiting"] == 1  # queued, not run
    first = engine.step()  # prefills a alone: its first token
    assert [c["rid"] for c in first] == [a] and len(first[0]["output_ids"]) == 1
    b = engine.add_request(input_ids=engine.tokenizer.encode(second), sampling_params=greedy(10))
    chunks = _drive(engine)
    chunks[a] = first + chunks[a]
    for rid, ref in ((a, ref_a), (b, ref_b)):
        assert "".join(c["text"] for c in chunks[rid]) == ref["text"]
        assert [t for c in chunks[rid] for t in c["output_ids"]] == ref["output_ids"]
        last = chunks[rid][-1]
        assert last["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 10
        assert last["meta_info"]["id"] == rid
        assert all(c.get("finish_reason") is None for c in chunks[rid][:-1])
    assert engine.step() == []  # nothing left: a step with no requests is a no-op
    _idle(engine)


def test_step_and_a_stream_share_steps(engine):
    ref = engine.generate(PROMPT, greedy(8))
    rid = engine.add_request(PROMPT, greedy(8))
    streamed = list(engine.generate("Hello there", greedy(12), stream=True))
    assert streamed[-1]["finish_reason"] == "length"
    # The stream's steps served the added request too; its chunks waited for `step`.
    pending = engine.step()
    assert {c["rid"] for c in pending} == {rid} and len(pending) >= 8
    assert [t for c in pending for t in c["output_ids"]] == ref["output_ids"]
    assert pending[-1]["finish_reason"] == "length"
    assert not engine.has_unfinished_requests()
    _idle(engine)


def test_abort_request_frees_it(engine):
    rid = engine.add_request(PROMPT, greedy(64))
    engine.step()
    engine.step()
    engine.abort_request(rid)
    engine.abort_request(rid)  # twice, and an unknown id: no error
    engine.abort_request("no-such-request")
    assert not engine.has_unfinished_requests() and engine.step() == []
    assert engine.get_server_info()["num_running"] == 0
    _idle(engine)


def test_failed_step_raises_then_reports_the_abort(engine, monkeypatch):
    rid = engine.add_request("A prompt about mountains", greedy(6))

    def broken(fb):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(engine.runner, "forward", broken)
    with pytest.raises(RuntimeError, match="kernel exploded"):
        engine.step()
    monkeypatch.undo()
    [chunk] = engine.step()  # the abort, so a `while has_unfinished_requests()` loop ends
    assert chunk["rid"] == rid and chunk["finish_reason"] == "abort"
    assert chunk["output_ids"] == [] and not engine.has_unfinished_requests()
    _idle(engine)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": [PROMPT, "Hi"]}, "one prompt"),
        ({"prompt": ""}, "empty"),
        ({"prompt": PROMPT, "input_ids": [1, 2]}, "exactly one"),
        ({"input_ids": "text"}, "not a string"),
        ({"prompt": PROMPT, "sampling_params": {"temperature": -1}}, "temperature"),
        ({"prompt": [1] * 600}, "context"),
    ],
)
def test_add_request_bad_input_queues_nothing(engine, kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request(**kwargs)
    assert not engine.has_unfinished_requests()
    info = engine.get_server_info()
    assert info["num_waiting"] == 0 and info["num_running"] == 0


def test_unused_stream_never_runs(engine):
    engine.generate(PROMPT, greedy(8), stream=True)
    info = engine.get_server_info()
    assert info["num_waiting"] == 0 and info["num_running"] == 0


def test_interrupted_generate_aborts_its_requests(engine, monkeypatch):
    calls = []
    real_step = engine.scheduler.step

    def step_then_interrupt():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine.scheduler, "step", step_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        engine.generate([PROMPT, "Hello"], greedy(20))
    monkeypatch.undo()
    assert engine.get_server_info()["num_running"] == 0
    _idle(engine)


def test_failed_step_frees_its_batch_and_caches_nothing(engine, monkeypatch):
    ref = engine.generate("A fresh prompt about rivers", greedy(6))["output_ids"]

    def broken(fb):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(engine.runner, "forward", broken)
    with pytest.raises(RuntimeError, match="kernel exploded"):
        engine.generate("Another fresh prompt about lakes", greedy(6))
    monkeypatch.undo()
    _idle(engine)
    again = engine.generate("Another fresh prompt about lakes", greedy(6))
    assert again["usage"]["cached_tokens"] == 0  # the failed prefill was not cached
    assert engine.generate("A fresh prompt about rivers", greedy(6))["output_ids"] == ref


def test_max_new_tokens_beyond_the_pool_stops_at_context(engine):
    out = engine.generate(PROMPT, {**greedy(5000), "ignore_eos": True})
    assert out["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == 512


def test_tiny_temperature_is_greedy_and_huge_top_k_is_clamped(engine):
    ref = engine.generate(PROMPT, greedy(6))["output_ids"]
    assert engine.generate(PROMPT, {"max_new_tokens": 6, "temperature": 1e-45})["output_ids"] == ref
    sampled = {"max_new_tokens": 6, "temperature": 0.01, "top_k": 2**62, "seed": 1}
    assert engine.generate(PROMPT, sampled)["output_ids"] == ref


def test_numpy_token_ids_are_accepted(engine):
    import numpy as np

    ids = engine.tokenizer.encode(PROMPT)
    out = engine.generate(input_ids=list(np.array(ids)), sampling_params=greedy(4))
    assert out["output_ids"] == engine.generate(PROMPT, greedy(4))["output_ids"]


def test_random_seed_reproducible_across_processes():
    import os
    import subprocess
    import sys

    code = (
        "from radixlm import Engine; e = Engine('smollm2-135m', max_total_tokens=512, "
        "random_seed=123, log_level='error'); "
        "print(e.generate('Once upon a time', {'max_new_tokens': 12})['output_ids'])"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(h)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for h in (1, 2)
    }
    assert len(outs) == 1


def test_kv_cache_dtype_differs_from_model_dtype():
    with Engine(MODEL, max_total_tokens=512, kv_cache_dtype="bfloat16") as e:
        out = e.generate(PROMPT, greedy(8))
        assert len(out["output_ids"]) == 8 and out["text"].startswith(", the city")


def test_float16_kv_pool_on_the_cpu_kernels_matches_torch_native():
    """--kv-cache-dtype float16 with fp32 weights: the C kernels (fused decode stack,
    extend attention) serve the half pool and give torch_native's greedy tokens, over a
    batch and across a prefix-cache hit."""
    from radixlm.kernels.cpu import CpuKernels

    prompts = [PROMPT, PROMPT + " It is", "The capital of Italy"]
    outs = {}
    for backend in ("auto", "torch_native"):
        with Engine(
            MODEL, max_total_tokens=1024, kv_cache_dtype="float16", attention_backend=backend
        ) as e:
            resolved = e.get_server_info()["resolved"]["attention_backend"]
            outs[resolved] = [
                [o["output_ids"] for o in e.generate(prompts, greedy(12))] for _ in range(2)
            ]
    if CpuKernels.load() is None:
        pytest.skip("the CPU kernels cannot be built here")
    assert set(outs) == {"CpuNativeBackend", "TorchNativeBackend"}
    first, again = outs["CpuNativeBackend"]
    assert first == again == outs["TorchNativeBackend"][0] == outs["TorchNativeBackend"][1]


def test_closed_engine_raises_typed_error():
    from radixlm.errors import EngineClosedError

    e = Engine(MODEL, max_total_tokens=256)
    stream = e.generate(PROMPT, greedy(8), stream=True)
    next(stream)
    e.shutdown()
    e.shutdown()  # idempotent
    with pytest.raises(EngineClosedError):
        e.generate(PROMPT, greedy(2))
    with pytest.raises(EngineClosedError):
        next(stream)


@pytest.mark.parametrize(
    "kwargs", [{"page_size": 3}, {"page_size": 2.0}, {"dtype": "int8"}, {"context_length": 1}]
)
def test_bad_engine_settings(kwargs):
    with pytest.raises(ValueError):
        Engine(MODEL, **kwargs)


def test_prefilled_prompts_are_shared_with_later_admissions():
    import random

    rng = random.Random(0)
    system = [rng.randrange(3, 49000) for _ in range(200)]
    prompts = [system + [rng.randrange(3, 49000) for _ in range(8)] for _ in range(4)]
    params = {**greedy(4), "ignore_eos": True}
    # 256 prefill tokens per step: one prompt per extend step, so each later prompt can
    # hit the shared system prompt inserted right after the first one's prefill.
    with Engine(MODEL, max_total_tokens=4096, max_prefill_tokens=256) as cached:
        outs = cached.generate(input_ids=prompts, sampling_params=params)
        assert [o["usage"]["cached_tokens"] for o in outs] == [0, 200, 200, 200]
        _idle(cached)
    with Engine(MODEL, max_total_tokens=4096, disable_radix_cache=True) as plain:
        ref = plain.generate(input_ids=prompts, sampling_params=params)
        assert all(o["usage"]["cached_tokens"] == 0 for o in ref)
        _idle(plain)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
