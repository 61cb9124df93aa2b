"""GPU check of radixlm's attention backends: correctness tests, then speed against the
device's own copy bandwidth.

Needs CUDA: without it the script prints why and exits with status 2, running nothing.

Method
------
1. Tests: ``TRITON_INTERPRET=0 python -m pytest -q tests/kernels`` in a subprocess, so the
   Triton kernels are compiled for the GPU; this runs the kernel tests on CUDA tensors and
   the ``gpu``-marked ones (half precision, FlashInfer, CUDA graphs end to end). The pass /
   fail line is recorded; ``--skip-tests`` skips it.
2. Copy bandwidth: ``dst.copy_(src)`` of a 1 GiB buffer, median of 20 after 3 warm-ups;
   bandwidth = 2 x bytes (read + write) / time. Every GB/s below is divided by it.
3. Attention, one layer, SmolLM2-135M heads (9 query / 3 KV heads, head_dim 64), bf16,
   ``--page-size`` (1), pages scattered at random through the pool. For each backend
   (torch_native, triton, flashinfer when installed), batch B in ``--batches`` (1 16 64
   256) and context L in ``--contexts`` (512 2048 8192):
   * decode: one query per request over L keys; bytes = B * L * (K + V row bytes + 4 table
     bytes) + q/out;
   * extend: ``--extend-tokens`` (256) new tokens per request after an L - 256 token cached
     prefix; bytes counted as for decode (each key read once), FLOPs = 4 * H * D * the
     visible (query, key) pairs.
   Time = median of ``--iters`` (20) CUDA-event-timed calls after 3 warm-ups, per-step
   metadata (`init_forward_metadata`) excluded and reported separately.
4. RMSNorm and SwiGLU (SmolLM2 widths 576 / 1536, bf16) at 1, 64, 256 and 8192 tokens:
   the Triton kernels against the model's torch code, to decide whether they pay.
5. Quantized GEMMs (`kernels.triton.quant_gemm`), N = K = ``--quant-dim`` (4096), bf16
   activations, M in ``--quant-m`` (1 16 2048: decode and prefill): W4A16 (group 128,
   asymmetric), W8A8 int8 and W8A8 fp8 (``torch._scaled_mm`` on sm 8.9+) against torch
   dequantize-then-matmul of the same weights each call and against the bf16 matmul of the
   dequantized weight. Weight GB/s = the stored weight bytes / time; ``max_rel_err`` = max
   |y - reference| / max |reference| against `kernels.quant_ref`.
6. Whole decode step of the bundled model (SmolLM2-135M-Instruct, bf16; a random model of
   the same shape when the bundled one is not installed): ``ModelRunner.forward`` on a
   scheduler-style CPU batch, including the host-to-device copy of the table rows, CUDA
   graph replay when enabled, and the logits copy back to the CPU. Backends: torch_native
   (eager), triton (graphs, and eager), flashinfer (graphs, when installed). Time = median
   of ``--iters`` steps after 3 warm-ups; bytes = weights + B * L * KV bytes per token.

Output: markdown tables on stdout and JSON at ``--output``
(default ``benchmarks/results/gpu_kernels.json``).

    python benchmarks/gpu_kernels.py            # full run, about 6-10 minutes on one H200
    python benchmarks/gpu_kernels.py --quick    # B 1 64, L 512 4096, 5 iterations
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRITON_INTERPRET", "0")  # compile kernels; set before triton loads

import torch  # noqa: E402

from radixlm.kernels import (  # noqa: E402
    ForwardBatch,
    ForwardMode,
    create_attention_backend,
    flashinfer_available,
)
from radixlm.runtime.executor.memory import KVPool  # noqa: E402

DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "gpu_kernels.json"
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M
SMOLLM2_SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


class Timer:
    """Median wall time in ms of a callable: CUDA events on CUDA, perf_counter on CPU."""

    def __init__(self, device: str, iters: int, warmup: int = 3):
        self.device, self.iters, self.warmup = device, iters, warmup

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def run_tests(timeout_s: float) -> dict[str, Any]:
    """The kernel tests with compiled Triton kernels (and the gpu-marked tests)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
        )
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, text = -1, f"{e.stdout or ''}\ntimed out after {timeout_s:.0f} s"
    lines = text.strip().splitlines()
    print("\n".join(lines[-25:]))
    return {
        "command": "TRITON_INTERPRET=0 " + " ".join(cmd[1:]),
        "returncode": code,
        "summary": lines[-1] if lines else "",
        "seconds": round(time.perf_counter() - t0, 1),
    }


def copy_bandwidth(device: str, timer: Timer, nbytes: int) -> float:
    """Device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def paged_batch(
    mode: ForwardMode, bsz: int, ctx: int, new: int, page_size: int, table: torch.Tensor
) -> ForwardBatch:
    """A step of `bsz` requests of `ctx` tokens (the last `new` of them new) whose pages are
    scattered at random over the pool; fills `table` rows 0..bsz-1. CPU tensors."""
    pages_per_req = -(-ctx // page_size)
    pages = torch.randperm(bsz * pages_per_req)[:, None] + 1
    slots = (pages * page_size + torch.arange(page_size)).view(bsz, -1)[:, :ctx]
    table[:bsz, :ctx] = slots.to(torch.int32)
    pre = torch.full((bsz,), ctx - new, dtype=torch.int64)
    ext = torch.full((bsz,), new, dtype=torch.int64)
    return ForwardBatch(
        mode=mode,
        input_ids=torch.randint(3, 1000, (bsz * new,)),
        positions=(pre[:, None] + torch.arange(new)).flatten(),
        out_cache_loc=slots[:, ctx - new :].flatten().to(torch.int64),
        req_pool_indices=torch.arange(bsz),
        seq_lens=pre + ext,
        extend_prefix_lens=pre,
        extend_seq_lens=ext,
        req_to_token=table,
    )


def attention_rows(args, device: str, timer: Timer, copy_gbs: float, backends, rows, save):
    """Decode and extend attention of one layer for every backend, batch and context;
    appends to `rows`, calling `save()` after each."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    elem = torch.empty((), dtype=dtype).element_size()
    row_bytes = KV_HEADS * HEAD_DIM * elem * 2 + 4  # K + V + one table entry per key
    for bsz in args.batches:
        for ctx in args.contexts:
            num_slots = (bsz * -(-ctx // args.page_size) + 1) * args.page_size
            pool = KVPool(num_slots, 1, KV_HEADS, HEAD_DIM, dtype, device, args.page_size)
            pool.k_buffer[0].normal_()
            pool.v_buffer[0].normal_()
            table = torch.zeros(bsz, ctx + 1, dtype=torch.int32)
            for mode, new in ((ForwardMode.DECODE, 1), (ForwardMode.EXTEND, args.extend_tokens)):
                new = min(new, ctx)
                fb = paged_batch(mode, bsz, ctx, new, args.page_size, table).to(device)
                q = torch.randn(bsz * new, HEADS, HEAD_DIM, dtype=dtype, device=device)
                pairs = bsz * (new * (ctx - new) + new * (new + 1) // 2)
                nbytes = bsz * ctx * row_bytes + 2 * q.numel() * elem
                for name in backends:
                    backend = create_attention_backend(
                        name, pool, HEAD_DIM**-0.5, num_heads=HEADS,
                        page_size=args.page_size, dtype=dtype,
                    )  # fmt: skip
                    meta_ms = timer(lambda b=backend, f=fb: b.init_forward_metadata(f))
                    run = backend.forward_decode if mode is ForwardMode.DECODE else (
                        backend.forward_extend
                    )  # fmt: skip
                    ms = timer(lambda r=run, x=q, f=fb: r(x, 0, f))
                    gbs = nbytes / ms / 1e6
                    rows.append(
                        {
                            "op": mode.name.lower(),
                            "backend": name,
                            "batch": bsz,
                            "context": ctx,
                            "new_tokens": new,
                            "ms": round(ms, 4),
                            "metadata_ms": round(meta_ms, 4),
                            "GB/s": round(gbs, 1),
                            "of_copy_bw": round(gbs / copy_gbs, 3),
                            "TFLOP/s": round(4 * HEADS * HEAD_DIM * pairs / ms / 1e9, 2),
                        }
                    )
                    print(_fmt_row(rows[-1]), flush=True)
                    save()
                    del backend
            del pool, table
            _free(device)


def elementwise_rows(device: str, timer: Timer, copy_gbs: float) -> list[dict[str, Any]]:
    """Triton RMSNorm and SwiGLU against the model's torch code (SmolLM2 widths, bf16): do
    they pay? Bytes = inputs read + output written."""
    import torch.nn.functional as F

    from radixlm.kernels.triton import rms_norm, silu_and_mul
    from radixlm.runtime.executor.layers.blocks import RMSNorm

    dtype = torch.bfloat16
    hidden, ffn = SMOLLM2_SHAPE["hidden_size"], SMOLLM2_SHAPE["intermediate_size"]
    norm = RMSNorm(hidden, 1e-5).to(device, dtype)
    rows = []
    for tokens in (1, 64, 256, 8192):
        x = torch.randn(tokens, hidden, dtype=dtype, device=device)
        gate, up = (torch.randn(tokens, ffn, dtype=dtype, device=device) for _ in range(2))
        cases = {
            ("rms_norm", "torch"): (lambda x=x: norm(x), 2 * x.numel()),
            ("rms_norm", "triton"): (lambda x=x: rms_norm(x, norm.weight, 1e-5), 2 * x.numel()),
            ("swiglu", "torch"): (lambda g=gate, u=up: F.silu(g) * u, 3 * gate.numel()),
            ("swiglu", "triton"): (lambda g=gate, u=up: silu_and_mul(g, u), 3 * gate.numel()),
        }
        for (op, impl), (fn, elems) in cases.items():
            ms = timer(fn)
            gbs = elems * 2 / ms / 1e6
            row = {"op": op, "impl": impl, "tokens": tokens, "ms": round(ms, 4)}
            row.update({"GB/s": round(gbs, 1), "of_copy_bw": round(gbs / copy_gbs, 3)})
            rows.append(row)
            print(_fmt_row(row), flush=True)
    return rows


def quant_gemm_rows(args, device: str, timer: Timer) -> list[dict[str, Any]]:
    """The Triton quantized GEMMs against torch dequantize + matmul (section 5)."""
    from radixlm.kernels import quant_ref
    from radixlm.kernels.triton.quant_gemm import w4a16_gemm, w8a8_fp8_gemm, w8a8_int8_gemm

    n = k = args.quant_dim
    group, bf16 = 128, torch.bfloat16
    g = torch.Generator(device=device).manual_seed(0)
    q4 = torch.randint(0, 16, (n, k), generator=g, device=device, dtype=torch.uint8)
    qpacked = quant_ref.pack_int4(q4)
    scales = torch.rand(n, k // group, generator=g, device=device) * 0.01
    zeros = torch.randint(0, 16, (n, k // group), generator=g, device=device, dtype=torch.uint8)
    q8 = torch.randint(-127, 128, (n, k), generator=g, device=device, dtype=torch.int8)
    qf8 = (torch.randn(n, k, generator=g, device=device) * 60).clamp(-448, 448)
    qf8 = qf8.to(torch.float8_e4m3fn)
    w_scale = torch.rand(n, generator=g, device=device) * 1e-3
    w4 = quant_ref.dequant_w4(qpacked, scales, zeros, group).to(bf16)
    methods = {  # name: (stored weight bytes, kernel, torch dequantize + matmul, reference)
        "w4a16": (
            qpacked.numel() + scales.numel() * 4 + zeros.numel(),
            lambda x: w4a16_gemm(x, qpacked, scales, zeros, group),
            lambda x: x @ quant_ref.dequant_w4(qpacked, scales, zeros, group).to(bf16).t(),
            lambda x: quant_ref.w4a16_ref(x, qpacked, scales, zeros, group),
        ),
        "w8a8_int8": (
            q8.numel() + w_scale.numel() * 4,
            lambda x: w8a8_int8_gemm(x, q8, w_scale),
            lambda x: x @ (q8.to(bf16) * w_scale[:, None].to(bf16)).t(),
            lambda x: quant_ref.w8a8_int8_ref(x, q8, w_scale),
        ),
        "w8a8_fp8": (
            qf8.numel() + w_scale.numel() * 4,
            lambda x: w8a8_fp8_gemm(x, qf8, w_scale),
            lambda x: x @ (qf8.to(bf16) * w_scale[:, None].to(bf16)).t(),
            lambda x: quant_ref.w8a8_fp8_ref(x, qf8, w_scale),
        ),
    }
    rows = []
    for m in args.quant_m:
        x = torch.randn(m, k, generator=g, device=device).to(bf16)
        flops = 2 * m * n * k
        cases = [("bf16_dense", "torch matmul", n * k * 2, lambda x=x: x @ w4.t(), None)]
        for name, (nbytes, kernel, torch_fn, ref) in methods.items():
            cases.append((name, "triton", nbytes, lambda x=x, f=kernel: f(x), ref))
            cases.append((name, "torch dequant+matmul", nbytes, lambda x=x, f=torch_fn: f(x), ref))
        for method, impl, nbytes, fn, ref in cases:
            ms = timer(fn)
            row = {"method": method, "impl": impl, "M": m, "N=K": n, "ms": round(ms, 4)}
            row["weight GB/s"] = round(nbytes / ms / 1e6, 1)
            row["TFLOP/s"] = round(flops / ms / 1e9, 2)
            row["max_rel_err"] = "-"
            if ref is not None:
                want = ref(x)
                err = (fn().float() - want).abs().max() / want.abs().max()
                row["max_rel_err"] = f"{err.item():.1e}"
            rows.append(row)
            print(_fmt_row(row), flush=True)
        _free(device)
    return rows


def model_dir(args, tmp: Path) -> tuple[Path, str]:
    """The bundled model's HF directory, or a random model of the same shape (`tmp`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if not args.smoke_cpu:
        try:
            from radixlm.runtime.executor.model_registry import local_hf_dir

            return local_hf_dir("smollm2-135m"), "SmolLM2-135M-Instruct"
        except Exception as e:  # noqa: BLE001  (any failure: fall back to random weights)
            print(f"bundled model unavailable ({e}); timing a random model of its shape")
    shape = dict(SMOLLM2_SHAPE)
    if args.smoke_cpu:
        shape.update(num_hidden_layers=2, max_position_embeddings=1024)
    config = LlamaConfig(**shape, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp)
    return tmp, "random weights, SmolLM2-135M shape"


def decode_step_rows(args, device, timer, copy_gbs, variants, hf_dir, rows, save):
    """Whole-model decode steps through ModelRunner for every backend variant; appends to
    `rows`, calling `save()` after each."""
    from transformers import AutoConfig

    from radixlm.config import ServerArgs
    from radixlm.runtime.executor.model_runner import ModelRunner

    config = AutoConfig.from_pretrained(hf_dir)
    max_bs, max_ctx = max(args.batches), max(args.contexts)
    for name, graphs in variants:
        server_args = ServerArgs(
            model=str(hf_dir),
            device=device,
            dtype="bfloat16" if device == "cuda" else "float32",
            attention_backend=name,
            disable_cuda_graph=not graphs,
            cuda_graph_max_bs=max_bs,
            page_size=args.page_size,
            max_total_tokens=max_bs * (-(-max_ctx // args.page_size) + 1) * args.page_size,
            max_running_requests=max_bs,
            context_length=max_ctx + 1,
        )
        t0 = time.perf_counter()
        runner = ModelRunner(server_args, hf_dir, config)
        build_s = time.perf_counter() - t0
        table = runner.req_to_token_pool.req_to_token
        for bsz in args.batches:
            for ctx in args.contexts:
                fb = paged_batch(ForwardMode.DECODE, bsz, ctx, 1, args.page_size, table)
                ms = timer(lambda r=runner, f=fb: r.forward(f))
                nbytes = runner.weights_bytes + bsz * ctx * runner.kv_bytes_per_token
                gbs = nbytes / ms / 1e6
                rows.append(
                    {
                        "op": "decode_step",
                        "backend": name + (" +graphs" if runner.graph_runner else ""),
                        "batch": bsz,
                        "context": ctx,
                        "ms": round(ms, 3),
                        "tokens/s": round(bsz / ms * 1e3, 1),
                        "GB/s": round(gbs, 1),
                        "of_copy_bw": round(gbs / copy_gbs, 3),
                        "build_s": round(build_s, 1),
                    }
                )
                print(_fmt_row(rows[-1]), flush=True)
                save()
        del runner, table
        _free(device)


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _fmt_row(row: dict[str, Any]) -> str:
    return "| " + " | ".join(str(v) for v in row.values()) + " |"


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + [_fmt_row(r) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--extend-tokens", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="B 1 64, L 512 4096, 5 iters")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--tests-only", action="store_true", help="run the tests, no timing")
    parser.add_argument("--tests-timeout", type=float, default=420, help="seconds")
    parser.add_argument("--skip-model", action="store_true", help="no whole-model decode steps")
    parser.add_argument("--quant-m", type=int, nargs="+", default=[1, 16, 2048])
    parser.add_argument("--quant-dim", type=int, default=4096, help="N = K of the GEMMs")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--smoke-cpu", action="store_true",
        help="exercise this script on CPU with torch_native at toy sizes (no results saved)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.smoke_cpu and not torch.cuda.is_available():
        print(
            "gpu_kernels.py needs a CUDA GPU, and torch.cuda.is_available() is False here: "
            "nothing was run. (CPU correctness lives in `python -m pytest tests/kernels`.)",
            file=sys.stderr,
        )
        return 2
    if args.quick:
        args.batches, args.contexts, args.iters = [1, 64], [512, 4096], 5
    device = "cpu" if args.smoke_cpu else "cuda"
    if args.smoke_cpu:
        args.batches, args.contexts, args.iters = [1, 4], [64, 128], 2
        args.extend_tokens, args.skip_tests = 16, True
        torch.set_num_threads(1)  # more threads crawl on a shared small CPU
    timer = Timer(device, args.iters)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }

    def save() -> None:  # after every section, so a run cut short keeps what it measured
        if not args.smoke_cpu:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(results, indent=1) + "\n")

    if not args.skip_tests:
        results["tests"] = run_tests(args.tests_timeout)
        save()
    if args.tests_only:
        return 0 if results["tests"]["returncode"] == 0 else 1
    copy_gbs = copy_bandwidth(device, timer, (1 << 30) if device == "cuda" else (1 << 26))
    results["copy_GB/s"] = round(copy_gbs, 1)
    print(f"copy bandwidth (read + write): {copy_gbs:.0f} GB/s", flush=True)

    backends = ["torch_native"]
    if device == "cuda":
        backends.append("triton")
        if flashinfer_available():
            backends.append("flashinfer")
    results["attention"] = []
    attention_rows(args, device, timer, copy_gbs, backends, results["attention"], save)
    if device == "cuda":
        results["elementwise"] = elementwise_rows(device, timer, copy_gbs)
        save()
        results["quant_gemm"] = quant_gemm_rows(args, device, timer)
        save()
    if not args.skip_model:
        variants = [("torch_native", False)]
        if device == "cuda":
            variants += [("triton", True), ("triton", False)]
            if flashinfer_available():
                variants.append(("flashinfer", True))
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir, results["model"] = model_dir(args, Path(tmp))
            results["decode_step"] = []
            decode_step_rows(
                args, device, timer, copy_gbs, variants, hf_dir, results["decode_step"], save
            )
    print("\n## Attention (one layer)\n" + _table(results["attention"]))
    print("\n## RMSNorm / SwiGLU\n" + _table(results.get("elementwise", [])))
    print("\n## Quantized GEMMs\n" + _table(results.get("quant_gemm", [])))
    print("\n## Decode step (whole model)\n" + _table(results.get("decode_step", [])))
    if not args.smoke_cpu:
        print(f"\nsaved {args.output}")
    tests_ok = results.get("tests", {}).get("returncode", 0) == 0
    return 0 if tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
