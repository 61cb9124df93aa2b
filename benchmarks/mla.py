"""KV cache per token, tokens that fit a fixed KV budget, and decode step time of multi-head
latent attention (DeepSeek-V3 layout) against MHA and GQA layouts of about the same
parameter count, beside `radixlm plan kv`'s prediction; and MLA's prefill in its absorbed
and expanded forms (`layers/mla_forms.py`) beside the form its cost rule picks.

Three random-weight fp32 models of `--layers` layers, hidden `--hidden`, `--heads` heads of
`--head-dim`, dense SwiGLU MLPs, built here from transformers' config classes and saved
with `save_pretrained` (the bundled SmolLM2 tokenizer): MLA (kv_lora_rank
`--kv-lora-rank`, RoPE key `--rope-dim`, no q LoRA, nope and value heads of `--head-dim`),
MHA (as many KV heads as heads) and GQA (`--kv-heads`). The dense models' MLP width is
chosen so their parameter count (planner's count) equals the MLA model's within one MLP
row. Each runs in an Engine whose KV pool holds what fits `--kv-budget-mb` at its own bytes
per token, with the `cpu` attention backend (radixlm's C kernels: the MLA decode kernel
for the latent pool, the GQA decode kernel for the others) and `--cpu-gemm` projections
(default torch: every model runs its layers one by one, where the packed layout would run
the dense models' decode steps as one fused C call and MLA's layer by layer). A decode
step is timed one `Engine.step` at a time: `--new` - 1 steps of a batch of `--batch`
prompts of `--prompt` tokens once all are decoding, median over `--reps` batches.

Prefill: the MLA model's EXTEND step with its `attention_forms.mode` forced to
"absorbed", then "expanded", for the batch of fresh prompts and for `--chunks` new tokens
per request after each request's cached `--prompt`-token prefix (time of a 1-token
generate over the prefix cache; median over `--reps`), with the form mode "auto" picks.
Prints markdown tables and writes JSON (default `benchmarks/results/mla.json`).

    PYTHONPATH=. python benchmarks/mla.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch
from engine_throughput import machine_info
from report import print_table_and_save

from radixlm import Engine
from radixlm.plan.kv import kv_bytes_per_token
from radixlm.plan.models import spec_from_config
from radixlm.runtime.executor.model_registry import local_hf_dir

VOCAB = 49152  # the bundled tokenizer's


def configs(args) -> dict:
    """name -> transformers config: MLA first, then MHA and GQA of the same parameters."""
    from transformers import DeepseekV3Config, LlamaConfig

    common = dict(vocab_size=VOCAB, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads, max_position_embeddings=4096,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)  # fmt: skip
    mla = DeepseekV3Config(
        **common, intermediate_size=args.intermediate, num_key_value_heads=args.heads,
        q_lora_rank=None, kv_lora_rank=args.kv_lora_rank, qk_rope_head_dim=args.rope_dim,
        qk_nope_head_dim=args.head_dim, v_head_dim=args.head_dim,
        first_k_dense_replace=args.layers, n_routed_experts=8, n_group=1, topk_group=1,
    )  # fmt: skip
    target = spec_from_config(mla.to_dict()).total_params()
    out = {"mla": mla}
    for name, kv_heads in (("mha", args.heads), ("gqa", args.kv_heads)):
        probe = LlamaConfig(**common, num_key_value_heads=kv_heads, head_dim=args.head_dim,
                            intermediate_size=1)  # fmt: skip
        rest = spec_from_config(probe.to_dict()).total_params() - 3 * args.hidden * args.layers
        inter = round((target - rest) / (3 * args.hidden * args.layers))
        out[name] = LlamaConfig(**common, num_key_value_heads=kv_heads, head_dim=args.head_dim,
                                intermediate_size=inter)  # fmt: skip
    return out


def save_random_model(config, path: Path, hf_dir: Path) -> None:
    """`config`'s transformers causal LM with seeded N(0, 0.02) matrices, saved under
    `path` with the bundled model's tokenizer files."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, path / name)


def prompts_of(args, length: int, salt: int = 0) -> list[list[int]]:
    """`--batch` distinct prompts of `length` token ids."""
    return [
        [(7 * i + 13 * salt + j) % 30000 + 100 for j in range(length)] for i in range(args.batch)
    ]


def timed_generate(engine: Engine, prompts: list[list[int]], n: int) -> float:
    """Seconds to generate `n` greedy tokens for every prompt."""
    t0 = time.perf_counter()
    params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)
    return time.perf_counter() - t0


def decode_step_ms(engine: Engine, args) -> float:
    """Median ms of `--new` - 1 decode steps of all `--batch` requests once every one has
    its first token (the scheduler interleaves prefill chunks with decode until then),
    over `--reps` batches (each with fresh prompts, the cache flushed); the requests are
    aborted afterwards."""
    params = {"max_new_tokens": 2048, "temperature": 0, "ignore_eos": True}
    times = []
    for rep in range(args.reps):
        engine.flush_cache()
        prompts = prompts_of(args, args.prompt, salt=rep)
        rids = {engine.add_request(input_ids=p, sampling_params=params) for p in prompts}
        started: set[str] = set()
        while started != rids:
            started |= {c["rid"] for c in engine.step() if c["output_ids"]}
        for _ in range(args.new - 1):
            t0 = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - t0) * 1e3)
        for rid in rids:
            engine.abort_request(rid)
        while engine.has_unfinished_requests():
            engine.step()
    return statistics.median(times)


def extend_ms(engine: Engine, args, prefix: int, new: int) -> float:
    """Median ms of one EXTEND step of `new` tokens per request after a cached `prefix`
    (0: fresh prompts), as a 1-token generate."""
    times = []
    for rep in range(args.reps + 1):  # the first is a warm-up
        engine.flush_cache()
        head = prompts_of(args, prefix, salt=rep)
        if prefix:
            timed_generate(engine, head, 1)
        tail = prompts_of(args, new, salt=rep + 100)
        times.append(timed_generate(engine, [h + t for h, t in zip(head, tail)], 1) * 1e3)
    return statistics.median(times[1:])


def prefill_forms(engine: Engine, args) -> list[dict]:
    """The MLA model's EXTEND steps in each form (module docstring)."""
    forms = engine.runner.model.attention_forms
    cases = [(0, args.prompt)] + [(args.prompt, n) for n in args.chunks]
    rows = []
    for prefix, new in cases:
        row = {"prefix": prefix, "new": new}
        for mode in ("absorbed", "expanded"):
            forms.mode = mode
            row[f"{mode}_ms"] = extend_ms(engine, args, prefix, new)
        forms.mode = "auto"
        cheaper = forms.expanded_cheaper([new] * args.batch, [prefix] * args.batch)
        row["auto_picks"] = "expanded" if cheaper else "absorbed"
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--kv-lora-rank", type=int, default=128)
    p.add_argument("--rope-dim", type=int, default=32)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--kv-budget-mb", type=float, default=256.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--new", type=int, default=17)
    p.add_argument("--chunks", type=int, nargs="*", default=[16, 64, 256])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpu-gemm", choices=["torch", "auto"], default="torch")
    p.add_argument("--output", default="benchmarks/results/mla.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    budget = int(args.kv_budget_mb * 2**20)
    hf_dir = local_hf_dir("smollm2-135m")
    rows, prefill = [], []
    engine_args = {"page_size": 16, "attention_backend": "cpu", "cpu_gemm": args.cpu_gemm,
                   "num_threads": args.threads, "max_running_requests": args.batch}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in configs(args).items():
            path = Path(tmp) / name
            save_random_model(config, path, hf_dir)
            spec = spec_from_config(config.to_dict())
            planned = kv_bytes_per_token(spec, "fp32")
            tokens = budget // int(planned) // 16 * 16
            with Engine(str(path), max_total_tokens=tokens, **engine_args) as e:
                info = e.get_server_info()
                step = decode_step_ms(e, args)
                if name == "mla":
                    prefill = prefill_forms(e, args)
            rows.append({
                "layout": name, "params_m": spec.total_params() / 1e6,
                "kv_bytes_per_token": info["kv_bytes_per_token"],
                "plan_kv_bytes_per_token": planned, "tokens_in_budget": info["max_total_tokens"],
                "plan_tokens_in_budget": int(budget // planned) // 16 * 16,
                "attention_backend": info["resolved"]["attention_backend"],
                "decode_step_ms": step,
            })  # fmt: skip
    lines = [
        f"KV budget {args.kv_budget_mb:g} MiB, fp32, decode at batch {args.batch} after "
        f"{args.prompt}-token prompts, {args.threads} thread(s), {args.cpu_gemm} GEMM",
        "",
        "| layout | params (M) | KV B/token | plan KV B/token | tokens in budget | plan tokens "
        "| decode step (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['params_m']:.2f} | {r['kv_bytes_per_token']} | "
            f"{r['plan_kv_bytes_per_token']:.0f} | {r['tokens_in_budget']} | "
            f"{r['plan_tokens_in_budget']} | {r['decode_step_ms']:.1f} |"
        )
    lines += [
        "",
        f"MLA EXTEND step (ms), batch {args.batch}, each form forced, and the form 'auto' picks",
        "",
        "| cached prefix | new tokens | absorbed | expanded | auto picks |",
        "|---|---|---|---|---|",
    ]
    for r in prefill:
        lines.append(
            f"| {r['prefix']} | {r['new']} | {r['absorbed_ms']:.1f} | {r['expanded_ms']:.1f} | "
            f"{r['auto_picks']} |"
        )
    print_table_and_save(lines, Path(args.output), args, load_before, machine=machine_info(),
                         torch=torch.__version__, rows=rows, prefill=prefill)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
