"""What the machine can do, measured in the run: memory bandwidth, fp32 peak, idleness,
and the roofline of a workload (the fastest any engine could serve it here).

Roofline (Williams, Waterman and Patterson, "Roofline", CACM 2009) applied to a decoder
workload: a forward pass over n tokens costs 2 * body_params * n FLOPs (every non-embedding
weight is used once per token in a multiply-add; attention score FLOPs are left out) plus
2 * logit_params FLOPs per sampled token (the LM head), and reads every weight once, so
    time >= max(total FLOPs / peak FLOP/s, passes * weight bytes / bandwidth)
where passes is the longest chain of forward passes one session needs in sequence (one
per output token: the prefill pass gives the first, each decode step one more). The
tokens an ideal engine must prefill are those not already in a prefix cache: a prompt's
longest common prefix with any earlier prompt of the run (a radix cache keeps it), and for
a turn that resends its history, everything up to the previous turn's last output token.
The bound ignores attention, sampling and scheduling, so real engines sit below it as far
as the probes measure the machine's real peak and bandwidth: a row above 100% means they
did not (a noisy neighbour during the probe, or an engine reading faster than the probes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _best_time(fn, tries: int) -> float:
    """Seconds of the fastest of `tries` timed calls of fn, after one untimed warm-up."""
    fn()
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def memory_bandwidth(threads: int, mib: int = 256, tries: int = 5) -> float:
    """Memory bandwidth in bytes/s on `threads` torch threads: the best of a read (sum of a
    `mib` MiB float32 tensor, counting its bytes), a copy (counting read + write bytes) and
    radixlm's one-row packed GEMM over `mib` MiB of fp32 weights in huge pages (counting
    the weight bytes; where its kernels build), each the best of `tries`. A decode step is
    almost all reads and a copy alone understates them; torch's sum reads one stream per
    thread, where the GEMM reads several at once and gets more out of the same memory."""
    import torch

    from radixlm.kernels.cpu import CpuKernels
    from radixlm.kernels.cpu.weights import into_huge_pages, pack_panels

    torch.set_num_threads(threads)
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    read = nbytes / _best_time(src.sum, tries)
    best = max(read, 2 * nbytes / _best_time(lambda: dst.copy_(src), tries))
    kernels = CpuKernels.load()
    if kernels is not None:
        k = 1024
        n = src.numel() // k
        _arena, (panels,) = into_huge_pages([pack_panels(src.view(n, k))])
        x = torch.ones(1, k)
        best = max(best, n * k * 4 / _best_time(lambda: kernels.mm(x, panels, n), tries))
    return best


def peak_flops(threads: int, n: int = 2048, tries: int = 5) -> float:
    """fp32 FLOP/s of an n x n x n product (2 n^3 FLOPs) on `threads` threads, best of
    `tries`: the better of torch's matmul (this machine's BLAS) and radixlm's packed GEMM
    (`CpuKernels.mm`, where its kernels build). MKL does not run its AVX-512 code on AMD
    CPUs, where radixlm's GEMM is the faster one (EPYC, 2 threads: about 200 vs 430 GFLOP/s)."""
    import torch

    from radixlm.kernels.cpu import CpuKernels
    from radixlm.kernels.cpu.weights import pack_panels

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = _best_time(lambda: a @ b, tries)
    kernels = CpuKernels.load()
    if kernels is not None:
        panels = pack_panels(b)
        best = min(best, _best_time(lambda: kernels.mm(a, panels, n), tries))
    return 2 * n**3 / best


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies over all CPUs from /proc/stat: user .. steal (idle includes
    iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[3] + fields[4], sum(fields)  # guest time is already inside user / nice


def cpu_busy(interval_s: float = 1.0) -> float:
    """Fraction of all CPUs' time spent busy (user, system, steal, ...) over the next
    `interval_s` seconds; 0.0 where /proc/stat is missing."""
    if not os.path.exists("/proc/stat"):
        return 0.0
    idle0, total0 = _cpu_times()
    time.sleep(interval_s)
    idle1, total1 = _cpu_times()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_for_quiet(busy_max: float = 0.10, limit_s: float = 60.0) -> tuple[float, float]:
    """Wait (1 s samples, at most `limit_s` seconds) until the CPUs are at most `busy_max`
    busy, so that a run does not start beside the previous engine's exiting processes.
    Returns (seconds waited, last busy fraction)."""
    t0 = time.perf_counter()
    busy = cpu_busy()
    while busy > busy_max and time.perf_counter() - t0 < limit_s:
        busy = cpu_busy()
    return time.perf_counter() - t0, busy


def _neighbour_setup() -> None:
    """In a neighbour before exec: nice 19, and (Linux) SIGKILL when its parent dies, so
    that a benchmark killed with SIGTERM or SIGKILL leaves no busy loop behind."""
    os.nice(19)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def busy_neighbours(n: int) -> Iterator[None]:
    """While the block runs, n busy-looping Python processes, each at nice 19 in a session
    of its own, as a build or another user's job would be (where Linux autogroups are on,
    `kernel.sched_autogroup_enabled`, each session gets an equal CPU share whatever its
    nice value). They are killed when the block ends, and with this process. n = 0:
    nothing."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    start_new_session=True,
                    preexec_fn=_neighbour_setup,
                )
            )
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def model_params(model_dir: Path) -> tuple[int, int, int]:
    """(body params, logit params, weight bytes) of a safetensors model directory. Body:
    every tensor but the token embedding and the LM head (a lookup and the logits, which
    only sampled tokens need); logit params: the LM head's, the embedding's when the two
    are tied (SmolLM2)."""
    from safetensors import safe_open

    total, embed, head, nbytes = 0, 0, 0, 0
    for f in sorted(model_dir.glob("*.safetensors")):
        nbytes += f.stat().st_size
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                n = 1
                for d in st.get_slice(name).get_shape():
                    n *= d
                total += n
                if name.endswith("embed_tokens.weight"):
                    embed = n
                elif name.endswith("lm_head.weight"):
                    head = n
    return total - embed - head, head or embed, nbytes


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def workload_work(workload: dict[str, Any], seen: list[list[int]]) -> dict[str, int]:
    """Tokens an ideal prefix-cached engine processes for `workload` (compare_engines'
    JSON form: sessions of [prompt ids, output length] turns), given the prompts `seen`
    earlier in the run (appended to). Returns prefill_tokens (uncached prompt tokens),
    decode_tokens (output tokens after each request's first), output_tokens, and
    passes (forward passes of the longest session, one per output token)."""
    prefill = decode = outputs = passes = 0
    for s in workload["sessions"]:
        session_passes = 0
        for k, (ids, out) in enumerate(s["turns"]):
            if k and s.get("resend_history"):
                prefill += len(ids) + 1  # the new turn + the previous answer's last token
            else:
                cached = max((_common_prefix(ids, p) for p in seen), default=0)
                prefill += len(ids) - min(cached, len(ids) - 1)
                seen.append(ids)
            decode += max(out - 1, 0)
            outputs += out
            session_passes += out
        passes = max(passes, session_passes)
    return {"prefill_tokens": prefill, "decode_tokens": decode, "output_tokens": outputs,
            "passes": passes}  # fmt: skip


def roofline(work: dict[str, int], body_params: int, logit_params: int, weight_bytes: int,
             peak: float, bandwidth: float) -> dict[str, float]:  # fmt: skip
    """The roofline time (seconds) and output tokens/s of `work` (from `workload_work`)
    on a machine of `peak` FLOP/s and `bandwidth` bytes/s; also its FLOPs and which
    roof binds ("compute" or "memory").

    The roofline, max(FLOPs / peak, passes * weight_bytes / bandwidth), assumes that the
    prefill's arithmetic overlaps the decode passes' weight reads, which needs decodes
    running beside each prefill. An engine gets none where it prefills a burst before
    decoding it, or where multi-turn sessions move in lockstep (each next turn arrives
    as its previous answer ends, all at once) and it does not stagger them, so
    `serial_seconds` / `serial_tokens_per_s` also give the bound without the overlap:
    the prefill at peak, then the decode phase at the slower of its two roofs, prefill
    FLOPs / peak + max(decode FLOPs / peak, passes * weight_bytes / bandwidth).
    """
    prefill_flops = 2 * body_params * work["prefill_tokens"]
    decode_flops = 2 * body_params * work["decode_tokens"]
    decode_flops += 2 * logit_params * work["output_tokens"]
    flops = prefill_flops + decode_flops
    compute_s = flops / peak
    memory_s = work["passes"] * weight_bytes / bandwidth
    seconds = max(compute_s, memory_s)
    serial = prefill_flops / peak + max(decode_flops / peak, memory_s)
    out = work["output_tokens"]
    return {"flops": flops, "seconds": seconds,
            "tokens_per_s": out / seconds if seconds else 0.0,
            "bound": "compute" if compute_s >= memory_s else "memory",
            "serial_seconds": serial,
            "serial_tokens_per_s": out / serial if serial else 0.0}  # fmt: skip
