"""Tensor parallelism over mixture-of-experts and latent-attention (MLA) models, CPU ranks
over gloo: greedy fp32 tokens with --tp-size 2 equal --tp-size 1's and transformers',
with chunked prefill, prefix-cache hits, retraction and n-gram speculation; logprobs agree
within 1e-4. Tiny configs
from `tests/tiny_models.py` (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from radixlm import Engine
from radixlm.plan.cli import main as plan_main
from radixlm.runtime.sched.decode import NormalDecode
from radixlm.runtime.speculative import make_speculative_decode
from tests.runtime.conftest import hf_greedy
from tests.tiny_models import save_family_model

NEW = 8
# A prompt longer than a chunk, one sharing the first's prefix (a cache hit).
PROMPTS = [list(range(100, 130)), list(range(100, 124)) + [7, 8, 9]]
ENGINE = dict(max_total_tokens=256, chunked_prefill_size=11, page_size=1)
FAMILIES = ["mixtral", "qwen2-moe", "qwen3-moe", "deepseek-v2", "deepseek-v3"]


def _greedy(n: int = NEW) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def _logprobs(engine, ids) -> list[float]:
    out = engine.generate(
        input_ids=ids, sampling_params=_greedy(3), return_logprob=True, logprob_start_len=0
    )
    meta = out["meta_info"]
    return [v for v, _, _ in meta["input_token_logprobs"][1:]] + [
        v for v, _, _ in meta["output_token_logprobs"]
    ]


def _assert_plan_agrees(path: str, info: dict, capsys) -> None:
    """`radixlm plan capacity --tp 2` over the engine's per-rank KV budget predicts its
    per-rank KV bytes per token (the whole latent) and its token capacity."""
    argv = ["capacity", "--model", path, "--kv-dtype", "fp32", "--page-size", "1"]
    argv += ["--kv-budget-bytes", str(info["kv_budget_bytes"]), "--tp", "2", "--json"]
    capsys.readouterr()
    assert plan_main(argv) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["kv_bytes_per_token_per_gpu"] == info["kv_bytes_per_token"]
    assert row["max_tokens"] == info["max_total_tokens"]


@pytest.mark.parametrize("family", FAMILIES)
def test_tp2_equals_tp1_and_transformers(family, tmp_path, hf_dir, capsys):
    model = save_family_model(family, tmp_path, hf_dir)
    refs = hf_greedy(model, PROMPTS, NEW, eos_token_id=None)
    with Engine(str(tmp_path), **ENGINE) as one:
        lp_one = _logprobs(one, PROMPTS[0])
        kv_one = one.get_server_info()["kv_bytes_per_token"]
    with Engine(str(tmp_path), tp_size=2, **ENGINE) as e:
        info = e.get_server_info()
        assert info["tp_size"] == 2
        if family.startswith("deepseek"):
            assert info["kv_bytes_per_token"] == kv_one
            assert e.runner.model.model.layers[0].self_attn.num_heads == 2
            _assert_plan_agrees(str(tmp_path), info, capsys)
        first = e.generate(input_ids=PROMPTS[0], sampling_params=_greedy())
        assert first["output_ids"] == refs[0]
        hit = e.generate(input_ids=PROMPTS[1], sampling_params=_greedy())
        assert hit["output_ids"] == refs[1]
        assert hit["usage"]["cached_tokens"] > 0
        lp_tp = _logprobs(e, PROMPTS[0])
    full = PROMPTS[0] + refs[0][:3]
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
    want = [float(ref[k - 1, full[k]]) for k in range(1, len(full))]
    assert lp_tp == pytest.approx(lp_one, abs=1e-4)
    assert lp_tp == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("family", ["qwen2-moe", "deepseek-v3"])
def test_expert_parallel_equals_transformers(family, tmp_path, hf_dir):
    """--ep-size 2: each rank holds half the routed experts whole (the shared expert
    split); tokens and logprobs equal transformers'."""
    model = save_family_model(family, tmp_path, hf_dir)
    refs = hf_greedy(model, PROMPTS, NEW, eos_token_id=None)
    with Engine(str(tmp_path), tp_size=2, ep_size=2, **ENGINE) as e:
        block = e.runner.model.model.layers[-1].mlp
        assert block.grouped_experts.w13.shape[0] == block.opts.num_experts // 2
        outs = e.generate(input_ids=PROMPTS, sampling_params=_greedy())
        assert [o["output_ids"] for o in outs] == refs
        lp = _logprobs(e, PROMPTS[0])
    full = PROMPTS[0] + refs[0][:3]
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
    assert lp == pytest.approx([float(ref[k - 1, full[k]]) for k in range(1, len(full))], abs=1e-4)


def test_expert_parallel_refusals(tmp_path, hf_dir):
    from radixlm.config import ServerArgs
    from radixlm.runtime.server.tp_ranks import check_args
    from tests.tiny_models import tiny_config

    with pytest.raises(ValueError, match="--ep-size must be 1 or --tp-size"):
        ServerArgs(tp_size=2, ep_size=4)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        check_args(ServerArgs(tp_size=2, ep_size=2), tiny_config("llama"))
    with pytest.raises(ValueError, match="this model has 3"):
        check_args(ServerArgs(tp_size=2, ep_size=2), tiny_config("qwen3-moe", num_experts=3))


@pytest.mark.parametrize("family", ["qwen3-moe", "deepseek-v3"])
def test_tp2_retraction_and_ngram_speculation(family, tmp_path, hf_dir):
    """A batch that cannot fit 48 slots at once (decode retracts) and n-gram speculation
    (the ranks replay verify forwards and KV slot copies) give transformers' tokens."""
    model = save_family_model(family, tmp_path, hf_dir)
    # Short prompts decoding together outgrow the pool (as in test_tensor_parallel.py).
    prompts = [
        [5, 17, 300, 4000, 9],
        [77, 78, 79, 80] * 6 + [123, 456],
        [5, 17, 300, 4000, 9, 11, 12],
    ]
    refs = hf_greedy(model, prompts, 10, eos_token_id=None)
    engine = dict(ENGINE, max_total_tokens=48, chunked_prefill_size=7)
    with Engine(str(tmp_path), tp_size=2, schedule_conservativeness=0.3, **engine) as e:
        batch = [0, 1, 2, 1, 1]
        outs = e.generate(input_ids=[prompts[i] for i in batch], sampling_params=_greedy(10))
        assert [o["output_ids"] for o in outs] == [refs[i] for i in batch]
        assert e.get_server_info()["scheduler"]["num_retracted_total"] > 0
        sched = e.scheduler
        args = dataclasses.replace(
            e.args, speculative_algorithm="ngram", speculative_budget="fixed"
        )
        sched.decoder = make_speculative_decode(args, e.runner)
        spec = e.generate(input_ids=prompts, sampling_params=_greedy(10))
        assert [o["output_ids"] for o in spec] == refs
        assert sched.stats()["spec_verify_steps_total"] > 0
        sched.decoder = NormalDecode()
