"""The agent-program workload suite on radixlm and its peers: one table, paired ratios.

Method
------
* Programs (workloads.py, inputs from data.py with fixed seeds): few-shot, react,
  tree-of-thought, skeleton-of-thought, llm-judge, json, multi-turn; every program of a
  workload starts at once; greedy, EOS ignored, fixed max_tokens (the JSON gen ends with
  its grammar).
* Engines (`ENGINES`), all on the same fp32 safetensors weights (llama-server: its f32
  GGUF; OpenVINO: its fp32 IR) and `--threads` compute threads (pinned as
  peer_servers.py / PEERS.md say): radixlm in-process (`EngineBackend`), `radixlm serve`
  (`RuntimeEndpoint`, native /generate), `radixlm serve --disable-radix-cache` (the share
  of the win prefix reuse gives), vLLM CPU and llama-server through `radixlm.lang.OpenAI`
  in completion mode (the same prompt strings; select and JSON through each server's
  constrained decoding, `structured_outputs` dialect "vllm" / "llama.cpp"), OpenVINO
  GenAI in-process (ov_backend.py; select and JSON through its StructuredOutputConfig).
  Peers come from $RADIXLM_PEERS_DIR (peer_servers.py); a missing one shows as not
  installed.
* N-gram speculation, every engine that has it: radixlm with `--speculative-algorithm
  ngram` (`-ngram` rows, in-process and served; greedy tokens equal the plain rows'),
  llama-server with `--spec-type ngram-simple`, OpenVINO GenAI with prompt lookup
  (`-lookup`). vLLM CPU's ngram speculator (`--speculative-config '{"method": "ngram"}'`)
  ran slower than its plain configuration on these programs (react 12.2 s against 10.1 s
  at the quick size, 2 threads, Zen 3), so vLLM keeps one row.
* Protocol: each repetition runs every engine in turn, the order reversed on every other
  repetition; each run is a fresh harness process (harness.py) and, for HTTP engines, a
  freshly started server (stopped with its process group after). Before each run the
  script waits (at most --quiet-wait s) for the CPUs to be at most 10% busy; the load
  average before and after each run is recorded.
* Reported per workload and engine: programs/s median (min-max over repetitions), output
  tokens/s, program latency p50 / p99 and cache hit rate (cached / prompt tokens of the
  gen calls, where the engine reports it) of the median repetition, semantic check
  failures, and radixlm's two ratios, plain and with n-gram speculation: in-process
  radixlm over in-process peers, `radixlm serve` over HTTP peers (and over itself
  without the radix cache / n-gram radixlm over plain radixlm); the median of the
  within-repetition ratios of programs/s. JSON: benchmarks/results/programs.json, whose
  `ratios` maps workload -> {peer row: plain radixlm's ratio} and `ratios_ngram` the
  same for n-gram radixlm; `targets` states per workload and radixlm configuration the
  ratio to vLLM and to the best peer row (the lowest ratio) against the issue's 1.5x /
  1.2x; `cache_ratios` and `speculation_ratios` hold the shares of the radix cache and
  of speculation.

    RADIXLM_PEERS_DIR=/work/peers python benchmarks/programs/run.py --quick --reps 1
    RADIXLM_PEERS_DIR=/work/peers python benchmarks/programs/run.py     # 3 repetitions
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent), str(ROOT)]

from machine import wait_for_quiet  # noqa: E402
from peer_servers import (  # noqa: E402
    OV_DIR,
    OV_PY,
    PEERS,
    _llama_server,
    _radixlm_serve,
    _stop,
    _vllm,
    _wait_ready,
    engine_environ,
    free_port,
)
from report import save_report  # noqa: E402
from summary import markdown_table, paired_ratio, run_figures, summarize  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

DEFAULT_OUTPUT = HERE.parent / "results" / "programs.json"
KV_TOKENS = 16384
QUIET_BUSY = 0.10
INPROC, SERVE = "radixlm", "radixlm-serve"
INPROC_NG, SERVE_NG = "radixlm-ngram", "radixlm-serve-ngram"
Launch = Callable[[Path, int, int, int], tuple[list[str], dict[str, str]]]


def _serve_nocache(model_dir: Path, threads: int, port: int, kv: int):
    return _radixlm_serve(model_dir, threads, port, kv, "--disable-radix-cache")


def _serve_ngram(model_dir: Path, threads: int, port: int, kv: int):
    return _radixlm_serve(model_dir, threads, port, kv, "--speculative-algorithm", "ngram")


def _llama_long(model_dir: Path, threads: int, port: int, kv: int):
    """llama-server with 2048 tokens per slot (16 slots): multi-turn histories pass 1024."""
    argv, env = _llama_server(model_dir, threads, port, kv)
    argv[argv.index("-c") + 1] = "32768"
    return argv, env


def _llama_ngram(model_dir: Path, threads: int, port: int, kv: int):
    """_llama_long with llama.cpp's n-gram speculation (`--spec-type ngram-simple`)."""
    argv, env = _llama_long(model_dir, threads, port, kv)
    return argv + ["--spec-type", "ngram-simple"], env


@dataclass(frozen=True)
class ProgramEngine:
    """One engine row. backend: harness.py's --backend; launch: the server (HTTP
    engines); python / model_dir: the harness interpreter and model (default: this one,
    the fp32 directory); dialect: the OpenAI backend's structured_outputs; speculative:
    harness.py's --speculative (in-process engines); reference / ngram_reference: the
    plain / n-gram radixlm row whose throughput its ratios divide by its own; needs:
    files that must exist."""

    key: str
    backend: str
    launch: Launch | None = None
    python: str | None = None
    model_dir: Path | None = None
    dialect: str | None = None
    speculative: str = "none"
    reference: str | None = None
    ngram_reference: str | None = None
    needs: tuple[Path, ...] = ()

    def availability(self) -> str | None:
        missing = [str(p) for p in self.needs if not p.exists()]
        return f"not installed ({', '.join(missing)} missing)" if missing else None


LLAMA_NEEDS = (PEERS / "llama.cpp/build/bin/llama-server", PEERS / "smollm2-135m-f32.gguf")
OV_NEEDS = (OV_PY, OV_DIR / "openvino_model.xml")
ENGINES: list[ProgramEngine] = [
    ProgramEngine(INPROC, "engine", ngram_reference=INPROC_NG),
    ProgramEngine(INPROC_NG, "engine", speculative="ngram"),
    ProgramEngine(SERVE, "endpoint", launch=_radixlm_serve, ngram_reference=SERVE_NG),
    ProgramEngine(SERVE_NG, "endpoint", launch=_serve_ngram),
    ProgramEngine("radixlm-serve-nocache", "endpoint", launch=_serve_nocache, reference=SERVE),
    ProgramEngine("vllm", "openai", launch=_vllm, dialect="vllm", reference=SERVE,
                  ngram_reference=SERVE_NG, needs=(PEERS / "vllm/bin/python",)),
    ProgramEngine("llama-server", "openai", launch=_llama_long, dialect="llama.cpp",
                  reference=SERVE, ngram_reference=SERVE_NG, needs=LLAMA_NEEDS),
    ProgramEngine("llama-server-ngram", "openai", launch=_llama_ngram, dialect="llama.cpp",
                  reference=SERVE, ngram_reference=SERVE_NG, needs=LLAMA_NEEDS),
    ProgramEngine("openvino", "openvino", python=str(OV_PY), model_dir=OV_DIR,
                  reference=INPROC, ngram_reference=INPROC_NG, needs=OV_NEEDS),
    ProgramEngine("openvino-lookup", "openvino", python=str(OV_PY), model_dir=OV_DIR,
                  speculative="ngram", reference=INPROC, ngram_reference=INPROC_NG,
                  needs=OV_NEEDS),
]  # fmt: skip
PEER_KEYS = ("vllm", "llama-server", "llama-server-ngram", "openvino", "openvino-lookup")
# The targets: radixlm over vLLM CPU and over the best peer configuration.
TARGET_VLLM, TARGET_BEST = 1.5, 1.2


def run_engine(e: ProgramEngine, model_dir: Path, names: list[str], args) -> dict[str, Any]:
    """One repetition of `e` on workloads `names`: the harness report (harness.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [e.python or sys.executable, str(HERE / "harness.py"), "--backend", e.backend,
               "--model-dir", str(e.model_dir or model_dir), "--threads", str(args.threads),
               "--kv-tokens", str(KV_TOKENS), "--workloads", ",".join(names),
               "--seed", str(args.seed), "--out", str(out)]  # fmt: skip
        if args.programs:
            cmd += ["--programs", str(args.programs)]
        elif args.quick:
            cmd.append("--quick")
        if e.dialect:
            cmd += ["--dialect", e.dialect]
        if e.speculative != "none":
            cmd += ["--speculative", e.speculative]
        server, log = None, None
        env = engine_environ(e, args.threads, TOKENIZERS_PARALLELISM="false")
        env["PYTHONPATH"] = str(ROOT)
        try:
            if e.launch is not None:
                port = free_port()
                argv, extra = e.launch(model_dir, args.threads, port, KV_TOKENS)
                log = Path(tmp) / "server.log"
                with log.open("w") as f:
                    server = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                              env=engine_environ(e, args.threads, **extra),
                                              start_new_session=True)  # fmt: skip
                url = f"http://127.0.0.1:{port}"
                _wait_ready(server, url, log)
                cmd += ["--url", url]
                env["OMP_NUM_THREADS"] = "1"  # the client: the cores are the server's
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        finally:
            if server is not None:
                _stop(server)
        if proc.returncode != 0:
            tail = proc.stderr[-1500:] + (log.read_text()[-1000:] if log else "")
            raise RuntimeError(f"{e.key} harness failed:\n{tail}")
        return json.loads(out.read_text())


def _series(by_engine: dict[str, list[dict]], key: str, reps: int) -> list[float | None]:
    """Programs/s of engine `key` per repetition (None where it did not run)."""
    by_rep = {r["rep"]: r["programs_per_s"] for r in by_engine.get(key, [])}
    return [by_rep.get(i) for i in range(reps)]


def _targets(peers: dict[str, float | None]) -> dict[str, Any]:
    """The issue's targets for one radixlm configuration from its ratios to the peer rows
    (`peers`: row -> ratio; a peer's variants are rows of their own, so the lowest ratio
    is the one to the best configuration of the best peer)."""
    ran = {k: v for k, v in peers.items() if v is not None}
    best = min(ran, key=ran.__getitem__) if ran else None
    vllm = ran.get("vllm")
    return {
        "vllm": vllm,
        "best_peer": best,
        "best_peer_ratio": ran.get(best),
        f"met_vllm_{TARGET_VLLM}x": None if vllm is None else vllm >= TARGET_VLLM,
        f"met_best_peer_{TARGET_BEST}x": None if best is None else ran[best] >= TARGET_BEST,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--engines", default=",".join(e.key for e in ENGINES),
        help="comma-separated: " + ", ".join(e.key for e in ENGINES))  # fmt: skip
    add("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    add("--reps", type=int, default=3, help="repetitions (default 3)")
    add("--threads", type=int, default=2, help="compute threads of every engine (default 2)")
    add("--quick", action="store_true", help="each workload's quick program count")
    add("--programs", type=int, default=None, help="programs per workload (overrides sizes)")
    add("--seed", type=int, default=0)
    add("--quiet-wait", type=float, default=60.0,
        help="most seconds to wait for idle CPUs before each run (0: none)")  # fmt: skip
    add("--output", type=Path, default=DEFAULT_OUTPUT,
        help=f"JSON report (default results/{DEFAULT_OUTPUT.name}; it records the settings, "
        "--quick included)")  # fmt: skip
    args = p.parse_args(argv)
    for flag, given, known in (("--engines", args.engines, [e.key for e in ENGINES]),
                               ("--workloads", args.workloads, list(WORKLOADS))):  # fmt: skip
        names = [n for n in given.split(",") if n]
        unknown = sorted(set(names) - set(known))
        if unknown or not names:
            p.error(f"{flag}: {'unknown ' + ', '.join(unknown) if unknown else 'none given'}")
    if args.reps < 1 or args.threads < 1 or (args.programs is not None and args.programs < 1):
        p.error("--reps, --threads and --programs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from radixlm.runtime.executor.model_registry import local_hf_dir

    model_dir = local_hf_dir("smollm2-135m")
    names = [n for n in args.workloads.split(",") if n]
    wanted = set(args.engines.split(","))
    engines = [e for e in ENGINES if e.key in wanted]
    status = {e.key: e.availability() for e in engines}
    figures: dict[str, dict[str, list]] = {w: {e.key: [] for e in engines} for w in names}
    meta: list[dict[str, Any]] = []
    for rep in range(args.reps):
        texts: dict[tuple[str, str], list] = {}
        for e in engines if rep % 2 == 0 else engines[::-1]:
            if status[e.key] is not None:
                continue
            waited, busy = wait_for_quiet(QUIET_BUSY, args.quiet_wait)
            load = os.getloadavg()
            print(f"[rep {rep + 1}] {e.key} (waited {waited:.0f} s, CPUs {busy:.0%} busy, "
                  f"load {load[0]:.2f})", file=sys.stderr, flush=True)  # fmt: skip
            t0 = time.perf_counter()
            try:
                report = run_engine(e, model_dir, names, args)
            except Exception as exc:  # noqa: BLE001 - record and go on with the others
                status[e.key] = f"failed: {str(exc).strip().splitlines()[-1][:160]}"
                print(f"  {status[e.key]}", file=sys.stderr, flush=True)
                continue
            meta.append({"rep": rep, "engine": e.key, "load_before": load,
                         "load_after": os.getloadavg(), "busy_before": busy,
                         "wall_s": time.perf_counter() - t0, "load_s": report["load_s"],
                         "warmup_s": report.get("warmup_s")})  # fmt: skip
            print(f"  done in {meta[-1]['wall_s']:.0f} s, load -> {meta[-1]['load_after'][0]:.2f}",
                  file=sys.stderr, flush=True)  # fmt: skip
            for w, r in report["workloads"].items():
                texts[(w, e.key)] = r["texts"]
                figures[w][e.key].append((rep, r))
        # figures need the in-process radixlm texts of the same repetition: filled below
        for w in names:
            for e in engines:
                runs = figures[w][e.key]
                if runs and runs[-1][0] == rep:
                    ref = texts.get((w, INPROC)) if e.key != INPROC else None
                    runs[-1] = (rep, run_figures(runs[-1][1], ref))
    per_rep = {
        w: {k: [dict(r[1], rep=r[0]) for r in v] for k, v in by.items()}
        for w, by in figures.items()
    }
    table: dict[str, dict[str, Any]] = {}
    ratios: dict[str, dict[str, float | None]] = {}
    ngram_ratios: dict[str, dict[str, float | None]] = {}
    for w in names:
        table[w], ratios[w], ngram_ratios[w] = {}, {}, {}
        for e in engines:
            if status[e.key] is not None and not per_rep[w][e.key]:
                table[w][e.key] = {"status": status[e.key]}
                continue
            table[w][e.key] = summarize(per_rep[w][e.key])
            for ref, out in ((e.reference, ratios), (e.ngram_reference, ngram_ratios)):
                if ref is not None:
                    out[w][e.key] = paired_ratio(
                        _series(per_rep[w], ref, args.reps), _series(per_rep[w], e.key, args.reps)
                    )
    markdown = markdown_table(table, [e.key for e in engines], ratios, ngram_ratios)
    print(markdown)
    peer_ratios, peer_ngram = (
        {w: {k: v for k, v in r.items() if k in PEER_KEYS} for w, r in by_wl.items()}
        for by_wl in (ratios, ngram_ratios)
    )
    targets = {w: {"radixlm": _targets(peer_ratios[w]), "radixlm-ngram": _targets(peer_ngram[w])}
               for w in names}  # fmt: skip
    save_report(
        {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "args": {k: str(v) for k, v in vars(args).items()},
            "engine_status": {k: v or "ok" for k, v in status.items()},
            "ratios": peer_ratios,
            "ratios_ngram": peer_ngram,
            "targets": targets,
            "cache_ratios": {w: r.get("radixlm-serve-nocache") for w, r in ratios.items()},
            "speculation_ratios": {
                w: {k: r.get(k) for k in (INPROC, SERVE)} for w, r in ngram_ratios.items()
            },
            "table": table,
            "runs": per_rep,
            "run_meta": meta,
            "markdown": markdown,
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
