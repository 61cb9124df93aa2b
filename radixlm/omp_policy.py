"""The OpenMP wait policy of the CPU compute threads, chosen before torch loads libgomp.

radixlm's CPU kernels and torch's ops run on libgomp's thread team. Each kernel call is a
parallel region ending in a barrier, about eight per decoder layer: 240 per SmolLM2-135M
decode step. Without ``OMP_WAIT_POLICY`` a thread that reaches a barrier first spins
(``GOMP_SPINCOUNT``, 300k iterations by default) before it sleeps. On a quiet machine
that saves a wake-up; beside any other runnable process it is ruinous: the spinning
thread spends its own share of the core, the scheduler gives the core to the other
process for a whole slice (milliseconds), and every one of the step's barriers waits for
it. ``nice`` does not help across sessions, where Linux autogroups give each session an
equal share of the CPU.

A short spin keeps nearly all of the quiet speed (no spin at all gives up part of it where
sleeping threads wake slowly) and almost all of the robustness beside a busy process; 1000
spins is the best trade measured (`benchmarks/contention.py`; figures in
docs/perf-notes.md, "OpenMP wait policy").

So `import radixlm` sets ``GOMP_SPINCOUNT=1000`` and ``OMP_WAIT_POLICY=PASSIVE`` (the
latter for OpenMP runtimes other than libgomp, such as LLVM's libomp, where only it
applies), plus the marker ``RADIXLM_OMP_DEFAULTS=1`` so that child processes (the
server's scheduler) know where their inherited values came from. It does so unless the
user set either variable or libgomp is already loaded: libgomp reads them once, when it
loads (import radixlm before torch, or export the variables before Python starts). The
setting holds for the whole process and its children, radixlm used as a client included.
`describe()` says which policy is in effect; the engine reports it as
``resolved.omp_wait_policy`` in `get_server_info()`.

libgomp also stops spinning altogether (its "throttled" count) once its worker threads
outnumber the CPUs, counting every pool: one per thread that has started parallel
regions. `release_thread_pool()` frees the calling thread's pool, for an engine built on
one thread and stepped on another.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys

#: What radixlm sets when the user set neither variable.
DEFAULTS = {"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": "PASSIVE"}
#: Set beside `DEFAULTS`: tells child processes that radixlm, not the user, chose them.
MARKER = "RADIXLM_OMP_DEFAULTS"
#: Barrier spins (libgomp iterations) up to which waiting counts as passive.
SHORT_SPIN = 1000
#: libgomp's spin count without either variable.
LIBGOMP_DEFAULT_SPIN = 300_000
#: `omp_pause_resource_t`'s omp_pause_hard (OpenMP 5.0): free the threads, not only idle them.
OMP_PAUSE_HARD = 2

_state: str | None = None  # what apply_default found, for describe()
_SPIN = re.compile(r"\s*(-?)\s*(\d+)\s*([kmgt]?)\s*", re.IGNORECASE)


def _libgomp_paths() -> list[str] | None:
    """The files of the libgomp this process has mapped (/proc/self/maps; None where that
    cannot be read)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "libgomp" in line})
    except OSError:
        return None


def libgomp_loaded() -> bool:
    """Whether this process has already mapped libgomp (Linux: /proc/self/maps; elsewhere
    whether torch is imported, which loads it)."""
    paths = _libgomp_paths()
    return "torch" in sys.modules if paths is None else bool(paths)


def _initial_environ() -> dict[str, str]:
    """The environment this process started with (/proc/self/environ; elsewhere
    os.environ): what a libgomp loaded at start-up read."""
    try:
        with open("/proc/self/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return dict(os.environ)
    pairs = (item.decode(errors="replace").partition("=") for item in items if b"=" in item)
    return {k: v for k, _, v in pairs}


def spin_count(env) -> float:
    """libgomp's barrier spin count under these variables, by its rules: GOMP_SPINCOUNT,
    when valid (digits with an optional k/M/G/T suffix, "infinite" / "infinity"; a minus
    sign wraps to the largest count), wins; else OMP_WAIT_POLICY (PASSIVE 0, ACTIVE 3e10,
    unset or invalid `LIBGOMP_DEFAULT_SPIN`)."""
    raw = env.get("GOMP_SPINCOUNT")
    if raw is not None:
        if raw.strip().lower() in ("infinite", "infinity"):
            return float("inf")
        m = _SPIN.fullmatch(raw)
        if m:
            if m.group(1):
                return float("inf")
            scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(3).lower()]
            return int(m.group(2)) * scale
    policy = env.get("OMP_WAIT_POLICY", "").strip().upper()
    return {"PASSIVE": 0, "ACTIVE": 30_000_000_000}.get(policy, LIBGOMP_DEFAULT_SPIN)


def policy_kind(env) -> str:
    """ "passive" when libgomp's threads sleep after at most `SHORT_SPIN` spins at a barrier
    under these variables, else "spin"."""
    return "passive" if spin_count(env) <= SHORT_SPIN else "spin"


def _radixlm_chose(env) -> bool:
    """Whether these variables are radixlm's `DEFAULTS` with its `MARKER` (set here or in
    a parent process)."""
    return env.get(MARKER) == "1" and all(env.get(k) == v for k, v in DEFAULTS.items())


def apply_default() -> None:
    """Set `DEFAULTS` (and `MARKER`) in os.environ unless the user set OMP_WAIT_POLICY or
    GOMP_SPINCOUNT or libgomp is already loaded; remember which case applied. Idempotent."""
    global _state
    if _state is not None:
        return
    loaded = libgomp_loaded()
    env = _initial_environ() if loaded else os.environ  # what libgomp read, or will read
    given = [f"{v}={env[v]}" for v in DEFAULTS if v in env]
    if given:
        by = ", set by radixlm" if _radixlm_chose(env) else ""
        _state = f"{policy_kind(env)} ({', '.join(given)}{by})"
    elif loaded:
        _state = "spin (libgomp's default: libgomp was loaded before radixlm was imported)"
    else:
        os.environ.update(DEFAULTS)
        os.environ[MARKER] = "1"
        settings = ", ".join(f"{k}={v}" for k, v in DEFAULTS.items())
        _state = f"passive ({settings}, set by radixlm)"


def describe() -> str:
    """The wait policy libgomp runs with in this process: "passive (...)" (threads sleep
    after at most `SHORT_SPIN` spins at a barrier) or "spin (...)", with the variables or
    the reason behind it."""
    apply_default()
    return _state or ""


def set_by_radixlm() -> dict[str, str]:
    """The variables radixlm put into this environment (`DEFAULTS` and `MARKER`, here or
    in a parent; empty when it set none or the user changed them since): what a child
    process that should run with its own OpenMP defaults must not inherit."""
    return {**DEFAULTS, MARKER: "1"} if _radixlm_chose(os.environ) else {}


def spins() -> bool:
    """Whether libgomp's threads spin long at barriers before sleeping."""
    return describe().startswith("spin")


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process has loaded, opened with ctypes, or None."""
    for path in _libgomp_paths() or []:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def release_thread_pool() -> bool:
    """Stop the OpenMP worker threads that the calling thread's parallel regions started.

    libgomp keeps one pool of workers per thread that starts parallel regions, and once
    the workers of all pools plus the main thread outnumber the CPUs it uses its
    "throttled" spin count: 0 under ``OMP_WAIT_POLICY=PASSIVE`` (100 with no policy, 1000
    under ACTIVE), so every barrier of a step then sleeps and wakes. An
    engine built on one thread and stepped on another (`EngineBackend`'s driver thread)
    would leave the first thread's idle pool counted, so the thread that built it calls
    this when it hands the compute on. A later parallel region on this thread starts a
    new pool.

    Calls ``omp_pause_resource_all`` (OpenMP 5.0; libgomp frees only the calling
    thread's pool). Returns True when libgomp did so, False where it is not loaded, too
    old to have the call, or the caller is inside a parallel region.
    """
    lib = _libgomp()
    pause = getattr(lib, "omp_pause_resource_all", None) if lib is not None else None
    if pause is None:
        return False
    return pause(OMP_PAUSE_HARD) == 0
