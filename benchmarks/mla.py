"""KV cache per token, tokens that fit a fixed KV budget, and decode step time of multi-head
latent attention (DeepSeek-V3 layout) against MHA and GQA layouts of about the same
parameter count, beside `radixlm plan kv`'s prediction.

Three random-weight fp32 models of `--layers` layers, hidden `--hidden`, `--heads` heads of
`--head-dim`, dense SwiGLU MLPs, saved with `save_pretrained` (the bundled SmolLM2
tokenizer): MLA (kv_lora_rank `--kv-lora-rank`, RoPE key `--rope-dim`, no q LoRA, nope
and value heads of `--head-dim`), MHA (as many KV heads as heads) and GQA (`--kv-heads`).
The dense models' MLP width is chosen so their parameter count (planner's count) equals
the MLA model's within one MLP row. Each runs in an Engine whose KV pool holds what fits
`--kv-budget-mb` at its own bytes per token; a decode step is timed as (time to generate
`--new` tokens - time to generate 1) / (new - 1) for a batch of `--batch` prompts of
`--prompt` tokens, median over `--reps`. Every model uses the torch_native backend (the
C kernels do not take the latent pool), so the attention code is the same for all three;
there, torch's SDPA takes its math path for MLA (V narrower than K) and its fused CPU
kernel for MHA/GQA, which dominates the MLA step time on CPU: the step times compare
those paths, not the layouts' memory traffic.
Prints a markdown table and writes JSON (default `benchmarks/results/mla.json`).

    PYTHONPATH=. python benchmarks/mla.py
"""

from __future__ import annotations

import argparse
import os
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
from tests.tiny_models import save_random_model

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


def decode_step_ms(engine: Engine, args) -> float:
    prompts = [[(7 * i + j) % 30000 + 100 for j in range(args.prompt)] for i in range(args.batch)]

    def run(n: int) -> float:
        t0 = time.perf_counter()
        params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
        engine.generate(input_ids=prompts, sampling_params=params)
        return time.perf_counter() - t0

    run(2)  # warm-up
    steps = []
    for _ in range(args.reps):
        engine.flush_cache()
        one = run(1)
        engine.flush_cache()
        steps.append((run(args.new) - one) / (args.new - 1) * 1e3)
    return statistics.median(steps)


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
    p.add_argument("--kv-budget-mb", type=float, default=64.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=17)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default="benchmarks/results/mla.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    budget = int(args.kv_budget_mb * 2**20)
    hf_dir = local_hf_dir("smollm2-135m")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in configs(args).items():
            path = Path(tmp) / name
            save_random_model(config, path, hf_dir)
            spec = spec_from_config(config.to_dict())
            planned = kv_bytes_per_token(spec, "fp32")
            tokens = budget // int(planned) // 16 * 16
            with Engine(str(path), max_total_tokens=tokens, page_size=16,
                        attention_backend="torch_native") as e:  # fmt: skip
                info = e.get_server_info()
                step = decode_step_ms(e, args)
            rows.append({
                "layout": name, "params_m": spec.total_params() / 1e6,
                "kv_bytes_per_token": info["kv_bytes_per_token"],
                "plan_kv_bytes_per_token": planned, "tokens_in_budget": info["max_total_tokens"],
                "plan_tokens_in_budget": int(budget // planned) // 16 * 16,
                "decode_step_ms": step,
            })  # fmt: skip
    lines = [
        f"KV budget {args.kv_budget_mb:g} MiB, fp32, batch {args.batch} x {args.prompt} "
        f"prompt tokens, {args.threads} thread(s)",
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
    print_table_and_save(lines, Path(args.output), args, load_before,
                         machine=machine_info(), torch=torch.__version__, rows=rows)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
