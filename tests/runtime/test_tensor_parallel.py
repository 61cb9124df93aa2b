"""Tensor parallelism through the Engine (`--tp-size`), CPU ranks over gloo: greedy fp32
tokens equal --tp-size 1's and transformers' with chunked prefill, prefix-cache hits,
retraction and n-gram speculation; logprobs agree within 1e-4; each rank's KV pool holds
only its heads; a rank's death raises an error naming it and leaves no process; bad splits
are refused at start. Tiny configs (two ranks, one thread each) plus the bundled SmolLM2
(9 heads, 3 KV heads: --tp-size 3)."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
import torch

from radixlm import Engine
from radixlm.config import ServerArgs
from radixlm.errors import UnsupportedModelError, WeightsMismatchError
from radixlm.runtime.executor.layers.tensor_parallel import check_tensor_parallel
from radixlm.runtime.executor.parallel.group import RankFailedError, dist_backend_for, rank_device
from radixlm.runtime.executor.parallel.shards import Shard
from radixlm.runtime.sched.decode import NormalDecode
from radixlm.runtime.server.tp_ranks import check_args
from radixlm.runtime.speculative import make_speculative_decode
from tests.runtime.conftest import hf_greedy
from tests.tiny_models import save_random_model, tiny_config

NEW = 10
# Short, repeated (n-gram drafts find matches), longer than a chunk, a shared prefix.
PROMPTS = [
    [5, 17, 300, 4000, 9],
    [77, 78, 79, 80] * 6 + [123, 456],
    list(range(100, 160)),
    [5, 17, 300, 4000, 9, 11, 12],
]
# Every request's prompt and output cannot fit 64 slots at once: decode retracts.
RETRACT_BATCH = [0, 1, 3, 1, 1]
ENGINE = dict(
    max_total_tokens=64, chunked_prefill_size=7, schedule_conservativeness=0.3, page_size=1
)

#: name -> (tiny config overrides or None for the bundled model, tp size): Llama with
#: 2 KV heads over 2 ranks (one each, tied head) and an odd vocabulary (the last rank's
#: part padded); Qwen3 with 1 KV head over 2 ranks
#: (replicated), q/k norms and an untied head; SmolLM2-135M over 3 ranks.
MODELS = {
    "llama-tp2": (("llama", {"vocab_size": 49155}), 2),
    "qwen3-tp2": (("qwen3", {"num_key_value_heads": 1}), 2),
    "smollm2-tp3": (None, 3),
}


def _greedy(n: int = NEW) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request, tmp_path_factory, hf_dir):
    """(model path, tp size, transformers model, greedy references of PROMPTS)."""
    spec, tp = MODELS[request.param]
    if spec is None:
        from transformers import AutoModelForCausalLM

        path = hf_dir
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    else:
        path = tmp_path_factory.mktemp(request.param)
        model = save_random_model(tiny_config(spec[0], **spec[1]), path, hf_dir)
    return str(path), tp, model, hf_greedy(model, PROMPTS, NEW, eos_token_id=None)


def _logprobs(engine, ids) -> tuple[list[float], list[float]]:
    out = engine.generate(
        input_ids=ids, sampling_params=_greedy(4), return_logprob=True, logprob_start_len=0
    )
    meta = out["meta_info"]
    return (
        [v for v, _, _ in meta["input_token_logprobs"][1:]],
        [v for v, _, _ in meta["output_token_logprobs"]],
    )


def test_tp_equals_tp1_and_transformers(case):
    path, tp, model, refs = case
    with Engine(path, **ENGINE) as one:
        lp_one = _logprobs(one, PROMPTS[1])
        kv_one = one.get_server_info()["kv_bytes_per_token"]
    with Engine(path, tp_size=tp, **ENGINE) as e:
        info = e.get_server_info()
        assert info["tp_size"] == tp
        kv = e.runner.model.model.layers[0].self_attn.num_kv_heads
        assert info["kv_bytes_per_token"] == kv_one * kv // model.config.num_key_value_heads
        assert info["kv_bytes_per_token_all_ranks"] == info["kv_bytes_per_token"] * tp
        # retraction and chunked prefill
        outs = e.generate(input_ids=[PROMPTS[i] for i in RETRACT_BATCH], sampling_params=_greedy())
        assert [o["output_ids"] for o in outs] == [refs[i] for i in RETRACT_BATCH]
        assert e.get_server_info()["scheduler"]["num_retracted_total"] > 0
        # prefix-cache hits
        again = e.generate(input_ids=PROMPTS[:2], sampling_params=_greedy())
        assert [o["output_ids"] for o in again] == refs[:2]
        assert all(o["usage"]["cached_tokens"] > 0 for o in again)
        # n-gram speculation: the ranks replay verify forwards and KV slot copies
        sched = e.scheduler
        args = dataclasses.replace(
            e.args, speculative_algorithm="ngram", speculative_budget="fixed"
        )
        sched.decoder = make_speculative_decode(args, e.runner)
        spec = e.generate(input_ids=PROMPTS[:2], sampling_params=_greedy())
        assert [o["output_ids"] for o in spec] == refs[:2]
        assert sched.stats()["spec_verify_steps_total"] > 0
        sched.decoder = NormalDecode()
        lp_tp = _logprobs(e, PROMPTS[1])
    full = PROMPTS[1] + refs[1][:4]
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
    want = [float(ref[k - 1, full[k]]) for k in range(1, len(full))]
    got = lp_tp[0] + lp_tp[1]
    assert got == pytest.approx(lp_one[0] + lp_one[1], abs=1e-4)
    assert got == pytest.approx(want, abs=1e-4)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, hf_dir) -> str:
    path = tmp_path_factory.mktemp("llama")
    save_random_model(tiny_config("llama"), path, hf_dir)
    return str(path)


def test_rank_death_raises_naming_the_rank(tiny_llama):
    e = Engine(tiny_llama, tp_size=2, max_total_tokens=256)
    try:
        _, proc, _ = e._stack.ranks._ranks[0]
        proc.kill()
        proc.join(10)
        with pytest.raises(RankFailedError, match=r"tensor-parallel rank 1 exited with code -9"):
            e.generate(input_ids=PROMPTS[0], sampling_params=_greedy())
    finally:
        e.shutdown()
    assert not proc.is_alive()


def test_shutdown_ends_every_rank(tiny_llama):
    e = Engine(tiny_llama, tp_size=2, max_total_tokens=256)
    procs = [p for _, p, _ in e._stack.ranks._ranks]
    e.generate(input_ids=PROMPTS[0], sampling_params=_greedy(2))
    e.shutdown()
    assert [p.exitcode for p in procs] == [0]


def test_a_checkpoint_that_fails_to_load_ends_every_rank(tmp_path, hf_dir):
    """Start-up failure: the load error comes out of the Engine, no rank is left."""
    from safetensors.torch import load_file, save_file

    save_random_model(tiny_config("llama"), tmp_path, hf_dir)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    before = set(psutil.Process().children())
    with pytest.raises((WeightsMismatchError, RankFailedError), match="up_proj"):
        Engine(str(tmp_path), tp_size=2, max_total_tokens=256)
    new = set(psutil.Process().children()) - before
    ranks = [p for p in new if "resource_tracker" not in " ".join(p.cmdline())]
    _, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive


def test_refuses_a_split_that_does_not_divide():
    with pytest.raises(ValueError, match="does not divide the model's 9 attention heads"):
        Engine("smollm2-135m", tp_size=2)
    with pytest.raises(ValueError, match="one must divide the other"):
        gqa = {"hidden_size": 96, "num_attention_heads": 12, "num_key_value_heads": 3}
        check_tensor_parallel(tiny_config("llama", **gqa), 4)
    with pytest.raises(ValueError, match="intermediate_size 130"):
        check_tensor_parallel(tiny_config("llama", intermediate_size=130), 4)
    with pytest.raises(ValueError, match="moe_intermediate_size 33"):
        check_tensor_parallel(tiny_config("qwen3-moe", moe_intermediate_size=33), 2)
    with pytest.raises(ValueError, match="tp_size must be >= 1"):
        ServerArgs(tp_size=0)


def test_refuses_more_ranks_than_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="--tp-size 2 needs 2 GPUs"):
        check_args(ServerArgs(device="cuda", tp_size=2), tiny_config("llama"))


def test_refuses_drafter_models():
    args = ServerArgs(tp_size=2, speculative_algorithm="draft", speculative_draft_path="x")
    with pytest.raises(UnsupportedModelError, match="n-gram speculation does"):
        check_args(args, tiny_config("llama"))


@pytest.mark.parametrize(
    ("other", "message"),
    [({"dp_size": 2}, "cannot be combined"), ({"hicache_tier": "disk"}, "not supported with")],
)
def test_refuses_combinations_it_does_not_run(other, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(tp_size=2, **other)


def test_shard_takes_its_rows_padded():
    full = torch.arange(10.0).view(5, 2)
    assert torch.equal(Shard(0, 3, 5, 3).take(full), torch.tensor([[6.0, 7], [8, 9], [0, 0]]))
    assert torch.equal(Shard(1, 1, 2).take(full), full[:, 1:])


def test_backend_and_device_per_rank():
    assert dist_backend_for("cuda:1") == "nccl" and dist_backend_for("cpu") == "gloo"
    assert rank_device("cuda", 1) == "cuda:1" and rank_device("cpu", 1) == "cpu"
