"""Decode-step time of a small Mixture-of-Experts stack against dense SwiGLU stacks of the
same active and of the same total parameters, with the weight bytes each step reads.

The MoE stack is `--layers` residual layers x <- x + moe(x) of `SparseMoeBlock`
(`--experts` experts, top-`--top-k`, width `--intermediate` over `--hidden`; random
N(0, 0.02) weights, so random inputs route about uniformly). The dense stacks have the
same layers of one SwiGLU MLP of width k * I (the same active parameters) and E * I (the
same total parameters). A decode step is one forward of b token rows through a stack.

Variants per batch: the MoE with `TorchExperts` and, where radixlm's C kernels load, with
`PackedExperts`, and each dense stack as torch modules and as the packed layout
(`PackedMLP`). Variants alternate within every repetition (A B C, then C B A) so machine
noise hits them alike; each (variant, batch) keeps the median step over `--reps` steps of
fresh random rows. With `--device cuda` the MoE runs `TritonExperts` and the dense stacks
torch on the GPU.

Bytes read per step count the feed-forward weights only (the router's E x H per layer is
left out, as in `radixlm plan moe`): the MoE reads the distinct experts each layer's
`ExpertCounter` recorded, the dense stacks all their weights. The table sets the measured
mean distinct experts per layer beside the plan's prediction E (1 - (1 - k/E)^b).
Prints a markdown table and writes JSON (default `benchmarks/results/moe.json`).

    PYTHONPATH=. python benchmarks/moe.py --threads 1 --batches 1 2 4 8 16 32 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import radixlm  # noqa: F401  (before torch: it sets libgomp's wait policy, omp_policy.py)

# isort: split
import torch
from engine_throughput import machine_info
from report import print_table_and_save
from torch import nn

from radixlm.kernels.cpu import CpuKernels
from radixlm.plan.moe import ExpertLayout
from radixlm.runtime.executor.layers import TorchLayers
from radixlm.runtime.executor.layers.blocks import MLP
from radixlm.runtime.executor.layers.cpu_linear import FloatPanels
from radixlm.runtime.executor.layers.moe import MoEOptions, SparseMoeBlock
from radixlm.runtime.executor.layers.moe_experts import TorchExperts, TritonExperts
from radixlm.runtime.executor.layers.packed import PackedExperts, PackedMLP


class ResidualStack(nn.Module):
    """x <- x + ffn(x) for each feed-forward module in turn; x [b, hidden]."""

    def __init__(self, ffns: list[nn.Module]):
        super().__init__()
        self.ffns = nn.ModuleList(ffns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for ffn in self.ffns:
            x = x + ffn(x)
        return x


def _random_state(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=gen) * 0.02 for k, v in module.state_dict().items()}


def _loaded(module: nn.Module, state: dict, device: str) -> nn.Module:
    module.load_state_dict(state, strict=True)
    TorchLayers().process_weights_after_loading(module)
    return module.to(device).eval()


def _dense_mlp(layout: str, hidden: int, width: int, kernels, prefix: str) -> nn.Module:
    """A SwiGLU MLP as torch modules ("torch") or the packed CPU layout ("packed")."""
    if layout == "packed":
        return PackedMLP(hidden, width, kernels, FloatPanels(), prefix)
    return MLP(hidden, width, TorchLayers(), prefix)


def build_stacks(args, kernels: CpuKernels | None) -> dict[str, ResidualStack]:
    """The variants' stacks, MoE variants sharing one set of weights and each dense width
    one set."""
    opts = MoEOptions(args.experts, args.top_k, args.hidden, args.intermediate)
    moe_states = [_random_state(SparseMoeBlock(opts), seed) for seed in range(args.layers)]
    impls = {"moe-torch": TorchExperts()}
    if args.device == "cuda":
        impls = {"moe-triton": TritonExperts(), **impls}
    elif kernels is not None:
        impls["moe-packed"] = PackedExperts(kernels)
    stacks = {}
    for name, impl in impls.items():
        blocks = [SparseMoeBlock(opts, impl, f"layers.{i}") for i in range(args.layers)]
        stacks[name] = ResidualStack(
            [_loaded(b, s, args.device) for b, s in zip(blocks, moe_states, strict=True)]
        )
    widths = {"active": args.top_k * args.intermediate, "total": args.experts * args.intermediate}
    for kind, width in widths.items():
        states = [
            _random_state(MLP(args.hidden, width, TorchLayers(), ""), 100 + seed)
            for seed in range(args.layers)
        ]
        layouts = ["torch"] + (["packed"] if args.device == "cpu" and kernels is not None else [])
        for layout in layouts:
            mlps = [
                _dense_mlp(layout, args.hidden, width, kernels, f"layers.{i}")
                for i in range(args.layers)
            ]
            stacks[f"dense-{kind}-{layout}"] = ResidualStack(
                [_loaded(m, s, args.device) for m, s in zip(mlps, states, strict=True)]
            )
    return stacks


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(args, stacks: dict[str, ResidualStack]) -> list[dict]:
    """Rows of {batch, <variant>_ms, distinct experts measured and predicted, bytes}."""
    layout = ExpertLayout(args.experts, args.top_k, args.hidden, args.intermediate, args.layers)
    expert_bytes = layout.expert_params * 4
    names = list(stacks)
    rows = []
    for b in args.batches:
        gen = torch.Generator().manual_seed(b)
        xs = [torch.randn(b, args.hidden, generator=gen).to(args.device) for _ in range(args.reps)]
        steps: dict[str, list[float]] = {n: [] for n in names}
        for stack in stacks.values():
            for ffn in stack.ffns:
                if isinstance(ffn, SparseMoeBlock):
                    ffn.counter.reset()
        with torch.inference_mode():
            for name in names:  # warm-up, not counted below
                stacks[name](xs[0])
            for rep, x in enumerate(xs):
                for name in names if rep % 2 == 0 else names[::-1]:
                    _sync(args.device)
                    t0 = time.perf_counter()
                    stacks[name](x)
                    _sync(args.device)
                    steps[name].append(time.perf_counter() - t0)
        counters = [f.counter for f in stacks["moe-torch"].ffns]
        distinct = sum(c.total for c in counters) / (len(counters) * counters[0].steps)
        row = {"batch": b}
        row.update({f"{n}_ms": statistics.median(steps[n]) * 1e3 for n in names})
        row.update(
            distinct_measured=distinct,
            distinct_predicted=layout.distinct(b),
            moe_bytes_measured=args.layers * distinct * expert_bytes,
            moe_bytes_predicted=args.layers * layout.distinct(b) * expert_bytes,
            dense_active_bytes=args.layers * args.top_k * expert_bytes,
            dense_total_bytes=args.layers * args.experts * expert_bytes,
        )
        rows.append(row)
    return rows


def markdown(rows: list[dict], names: list[str]) -> list[str]:
    heads = [f"{n} ms" for n in names] + [
        "experts/layer", "plan", "MoE MB/step", "plan MB", "dense-active MB", "dense-total MB",
    ]  # fmt: skip
    lines = ["| batch | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for r in rows:
        cells = [f"{r[f'{n}_ms']:.2f}" for n in names] + [
            f"{r['distinct_measured']:.2f}", f"{r['distinct_predicted']:.2f}",
            f"{r['moe_bytes_measured'] / 1e6:.1f}", f"{r['moe_bytes_predicted'] / 1e6:.1f}",
            f"{r['dense_active_bytes'] / 1e6:.1f}", f"{r['dense_total_bytes'] / 1e6:.1f}",
        ]  # fmt: skip
        lines.append(f"| {r['batch']} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=8, help="routed experts E (default 8)")
    ap.add_argument("--top-k", type=int, default=2, help="experts per token k (default 2)")
    ap.add_argument("--hidden", type=int, default=512, help="model width H (default 512)")
    ap.add_argument("--intermediate", type=int, default=1024, help="expert width I (1024)")
    ap.add_argument("--layers", type=int, default=4, help="stacked layers (default 4)")
    ap.add_argument(
        "--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64], help="token rows"
    )
    ap.add_argument("--reps", type=int, default=30, help="timed steps per variant (30)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 layers, b = 1 4, 3 reps")
    ap.add_argument("--output", default="benchmarks/results/moe.json", help="JSON path")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.batches, args.reps = 2, [1, 4], 3
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    kernels = CpuKernels.load() if args.device == "cpu" else None
    stacks = build_stacks(args, kernels)
    rows = run(args, stacks)
    names = list(stacks)
    print_table_and_save(
        markdown(rows, names), Path(args.output), args, load_before,
        machine=machine_info(), torch=torch.__version__, variants=names, rows=rows,
        gpu=torch.cuda.get_device_name() if args.device == "cuda" else None,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
