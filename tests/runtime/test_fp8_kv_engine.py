"""--kv-cache-dtype fp8_e4m3 / fp8_e5m2 end to end on a tiny random Llama: greedy output
against the unquantized run, checkpoint KV scales, capacity in the engine's info and the
planner, the hicache and PD copies of fp8 rows, and the start-up refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm import Engine
from radixlm.kernels.fp8 import FP8_DTYPES, KVScales, quantize
from radixlm.runtime.executor.memory import KVPool
from tests.tiny_models import save_random_model, tiny_config

PROMPTS = [[5, 17, 300, 4000, 9], [77] * 30 + [123, 456], list(range(100, 200))]
NEW = 12
PARAMS = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
# "auto" on CPU: the C attention kernels over the fp8 pool; "torch": torch_native.
PATHS = {"auto": {}, "torch": {"cpu_gemm": "torch", "attention_backend": "torch_native"}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, hf_dir) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_random_model(tiny_config("llama"), path, hf_dir)
    return path


def _generate(model: Path, **kw) -> list[dict]:
    with Engine(str(model), max_total_tokens=1024, page_size=4, **kw) as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=PARAMS, return_logprob=True)
    return outs


def _tokens_and_logprobs(out: dict) -> tuple[list[int], list[float]]:
    entries = out["meta_info"]["output_token_logprobs"]
    return [e[1] for e in entries], [e[0] for e in entries]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("fmt", sorted(FP8_DTYPES))
def test_fp8_greedy_equals_a_fake_quantized_float32_cache(tiny, path, fmt, monkeypatch):
    """The fp8 run (C kernels or torch_native) equals, token for token and in logprobs to
    float rounding, a float32-KV torch_native run whose stored K/V are first rounded
    through the fp8 format (the values the fp8 pool reads back): fp8 storage changes
    nothing but the stored values. Against the plain float32 run the first tokens agree;
    the logprob gaps there are those of the rounding (this random model is sensitive:
    float16 KV moves them by ~3e-3, e4m3 by up to ~0.5)."""
    fp8 = _generate(tiny, kv_cache_dtype=fmt, **PATHS[path])
    plain = _generate(tiny, **PATHS["torch"])
    dtype, store = FP8_DTYPES[fmt], KVPool.set_kv

    def rounded_store(self, layer_id, loc, k, v):
        store(self, layer_id, loc, quantize(k, 1.0, dtype).float(), quantize(v, 1.0, dtype).float())

    monkeypatch.setattr(KVPool, "set_kv", rounded_store)
    rounded = _generate(tiny, **PATHS["torch"])
    for got, want, base in zip(fp8, rounded, plain):
        tg, lg = _tokens_and_logprobs(got)
        tw, lw = _tokens_and_logprobs(want)
        assert tg == tw
        torch.testing.assert_close(lg, lw, atol=2e-4, rtol=0)
        assert tg[:2] == _tokens_and_logprobs(base)[0][:2]
        assert lg != _tokens_and_logprobs(base)[1]  # the pool really was quantized


def _with_kv_scales(src: Path, dst: Path, k: list[float], v: list[float], style: str) -> None:
    """A copy of the checkpoint with KV scales as llm-compressor's kv_cache_scheme writes
    them (`self_attn.k_scale`) or the older `k_proj.output_scale` names."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(src / "model.safetensors")
    for i, (ks, vs) in enumerate(zip(k, v)):
        if style == "self_attn":
            names = ("self_attn.k_scale", "self_attn.v_scale")
        else:
            names = ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale")
        state[f"model.layers.{i}.{names[0]}"] = torch.tensor([ks])
        state[f"model.layers.{i}.{names[1]}"] = torch.tensor(vs)
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("style", ["self_attn", "output_scale"])
def test_checkpoint_kv_scales_are_read(tiny, tmp_path, style):
    """Scales in the checkpoint reach the pool (and /get_server_info); the weight loader
    leaves them out of the model; an unquantized KV cache ignores them."""
    k, v = [0.02, 0.03], [0.015, 0.01]
    scaled = tmp_path / "scaled"
    _with_kv_scales(tiny, scaled, k, v, style)
    with Engine(str(scaled), max_total_tokens=256, kv_cache_dtype="fp8_e4m3") as engine:
        info = engine.get_server_info()
        pool_scales = engine.runner.kv_pool.kv_scales
    assert info["resolved"]["kv_cache_dtype"] == "float8_e4m3fn"
    assert info["resolved"]["kv_scales"] == {"k": pytest.approx(k), "v": pytest.approx(v)}
    assert pool_scales == KVScales(
        tuple(info["resolved"]["kv_scales"]["k"]), tuple(info["resolved"]["kv_scales"]["v"])
    )
    plain = _generate(tiny)
    scaled_plain = _generate(scaled)
    assert [o["output_ids"] for o in scaled_plain] == [o["output_ids"] for o in plain]
    with Engine(str(scaled), max_total_tokens=256) as engine:
        assert engine.get_server_info()["resolved"]["kv_scales"] is None


def test_partial_checkpoint_scales_are_refused(tiny, tmp_path):
    scaled = tmp_path / "partial"
    _with_kv_scales(tiny, scaled, [0.5], [0.5], "self_attn")  # layer 0 only of 2
    with pytest.raises(ValueError, match="KV cache scales but none for"):
        Engine(str(scaled), max_total_tokens=256, kv_cache_dtype="fp8_e5m2")


def _plan_capacity(model: Path, budget: int, kv: str, page: int, capsys) -> dict:
    """`radixlm plan capacity --json` for `model`'s config at one KV budget: its TP 1 row."""
    from radixlm.plan.cli import main

    argv = ["capacity", "--model", str(model / "config.json"), "--gpu", "cpu", "--tp", "1"]
    argv += ["--kv-dtype", kv, "--kv-budget-bytes", str(budget), "--page-size", str(page)]
    capsys.readouterr()
    main([*argv, "--json"])
    return json.loads(capsys.readouterr().out)["rows"][0]


def test_capacity_doubles_against_float16_in_info_and_plan(tiny, capsys):
    """KV bytes per token: fp8 is half of float16 and a quarter of float32; the engine's
    token capacity is its KV budget over those bytes, as `radixlm plan capacity` computes
    it for the same budget (the planner takes radixlm's dtype names)."""
    page = 4
    infos = {}
    for kv in ("float32", "float16", "fp8_e4m3", "fp8_e5m2"):
        with Engine(str(tiny), mem_fraction=0.004, page_size=page, kv_cache_dtype=kv) as e:
            infos[kv] = e.get_server_info()
    bpt = {kv: i["kv_bytes_per_token"] for kv, i in infos.items()}
    # 2 layers x 2 KV heads x head_dim 16 x (K, V)
    assert bpt == {"float32": 512, "float16": 256, "fp8_e4m3": 128, "fp8_e5m2": 128}
    for kv, info in infos.items():
        budget = info["kv_budget_bytes"]
        assert info["max_total_tokens"] == budget // bpt[kv] // page * page
        row = _plan_capacity(tiny, budget, kv, page, capsys)
        assert row["kv_bytes_per_token_per_gpu"] == bpt[kv]
        assert row["max_tokens"] == info["max_total_tokens"]
    budget = infos["float16"]["kv_budget_bytes"]
    fp16 = _plan_capacity(tiny, budget, "float16", page, capsys)["max_tokens"]
    fp8 = _plan_capacity(tiny, budget, "fp8_e4m3", page, capsys)["max_tokens"]
    assert fp8 in (2 * fp16, 2 * fp16 + page)  # page rounding of the float16 count


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"attention_backend": "flashinfer"}, "'flashinfer' does not read an fp8 KV cache"),
        ({"hicache_tier": "fp8"}, "--kv-cache-dtype fp8_e4m3 stores 8-bit KV already"),
        ({"hicache_tier": "int8"}, "--hicache-tier int8 would quantize it again"),
    ],
)
def test_unsupported_combinations_fail_at_start(tiny, kw, message):
    with pytest.raises(ValueError, match=message):
        Engine(str(tiny), max_total_tokens=256, kv_cache_dtype="fp8_e4m3", **kw)


def test_unknown_kv_cache_dtype_is_refused():
    from radixlm.config import ServerArgs

    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        ServerArgs(kv_cache_dtype="fp8")


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_hicache_tiers_round_trip_fp8_rows(tier, tmp_path):
    """A host or disk tier copies an fp8 pool's rows as bytes, back bit for bit."""
    from radixlm.runtime.executor.kv_tier import DiskTier, HostTier

    pool = KVPool(32, 2, 2, 8, torch.float8_e4m3fn)
    src = torch.arange(4, 12)
    for layer in range(2):
        pool.set_kv(layer, src, torch.randn(8, 2, 8), torch.randn(8, 2, 8))
    made = DiskTier(pool, 16, 4, str(tmp_path)) if tier == "disk" else HostTier(pool, 16, 4)
    slots = made.alloc(8)
    made.write(src, slots)
    dst = torch.arange(16, 24)
    assert made.read(slots, dst)
    for buf in pool.k_buffer + pool.v_buffer:
        assert torch.equal(buf[dst].view(torch.uint8), buf[src].view(torch.uint8))


def test_disaggregation_moves_fp8_rows_as_they_are():
    """PD transfer: gather and scatter keep an fp8 pool's bytes; the layout names the fp8
    dtype, so a prefill and a decode worker of different formats do not match."""
    from radixlm.config import ServerArgs
    from radixlm.runtime.disagg.kv_pages import gather, kv_layout, scatter

    a, b = (KVPool(16, 2, 2, 8, torch.float8_e5m2) for _ in range(2))
    src, dst = torch.tensor([3, 4, 5]), torch.tensor([9, 1, 12])
    for layer in range(2):
        a.set_kv(layer, src, torch.randn(3, 2, 8), torch.randn(3, 2, 8))
    scatter(b, dst, gather(a, src))
    for x, y in zip(a.k_buffer + a.v_buffer, b.k_buffer + b.v_buffer):
        assert torch.equal(x[src].view(torch.uint8), y[dst].view(torch.uint8))
    e4m3 = KVPool(16, 2, 2, 8, torch.float8_e4m3fn)
    args = ServerArgs()
    assert kv_layout(args, a).mismatch(kv_layout(args, e4m3))
