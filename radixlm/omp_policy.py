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

A short spin keeps the quiet speed and gives all of the robustness. Measured on the
2-core AVX2 EPYC, 2 compute threads, SmolLM2-135M, beside one busy-looping process at
nice 19 in another session (`benchmarks/contention.py`), batch 1 / batch 16 decode step /
512-token prefill, ms, one run each (the first and last rows: median of 2):

| GOMP_SPINCOUNT | quiet | one busy neighbour |
|---|---|---|
| 300000 (libgomp's default) | 20.7 / 28.9 / 709 | 1187 / 1244 / 3902 |
| 30000 | 18.2 / 28.8 / 703 | 284 / 317 / 1935 |
| 3000 | 19.4 / 28.3 / 712 | 58 / 80 / 1429 |
| 1000 | 20.7 / 28.6 / 716 | 41 / 64 / 1537 |
| 300 (radixlm's default) | 19.2 / 29.2 / 734 | 34 / 59 / 1444 |
| 0 (OMP_WAIT_POLICY=PASSIVE) | 20.7 / 31.0 / 719 | 33 / 58 / 1462 |

(A busy neighbour leaves one core: one compute thread runs 32 / 53 / 1380 there.)

So `import radixlm` sets ``GOMP_SPINCOUNT=300`` and ``OMP_WAIT_POLICY=PASSIVE`` (for
OpenMP runtimes other than libgomp), unless the user set either or libgomp is already
loaded (it reads them once, when it loads: import radixlm before torch). Child processes
(the server's scheduler) inherit them. `describe()` says which policy is in effect; the
engine reports it as ``resolved.omp_wait_policy`` in `get_server_info()`.
"""

from __future__ import annotations

import os
import sys

#: What radixlm sets when the user set neither variable.
DEFAULTS = {"GOMP_SPINCOUNT": "300", "OMP_WAIT_POLICY": "PASSIVE"}
#: Barrier spins (libgomp iterations) up to which waiting counts as passive.
SHORT_SPIN = 1000

_state: str | None = None  # what apply_default found, for describe()


def libgomp_loaded() -> bool:
    """Whether this process has already mapped libgomp (Linux: /proc/self/maps; elsewhere
    whether torch is imported, which loads it)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return "torch" in sys.modules


def _spin_count(env) -> float:
    """libgomp's barrier spin count under these variables (GOMP_SPINCOUNT wins; it takes
    k/M/G/T suffixes and "infinite"; an unreadable value counts as a long spin)."""
    raw = env.get("GOMP_SPINCOUNT")
    if raw is None:
        policy = env.get("OMP_WAIT_POLICY", "").strip().upper()
        return {"PASSIVE": 0, "ACTIVE": float("inf")}.get(policy, 300_000)
    raw = raw.strip().lower()
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(raw[-1:], 1)
    try:
        return float("inf") if raw == "infinite" else float(raw.rstrip("kmgt")) * scale
    except ValueError:
        return float("inf")


def apply_default() -> None:
    """Set `DEFAULTS` in os.environ unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT
    or libgomp is already loaded; remember which case applied. Idempotent."""
    global _state
    if _state is not None:
        return
    user = [f"{v}={os.environ[v]}" for v in DEFAULTS if v in os.environ]
    if user:
        kind = "passive" if _spin_count(os.environ) <= SHORT_SPIN else "spin"
        _state = f"{kind} ({', '.join(user)})"
    elif libgomp_loaded():
        _state = "spin (libgomp's default: libgomp was loaded before radixlm was imported)"
    else:
        os.environ.update(DEFAULTS)
        given = ", ".join(f"{k}={v}" for k, v in DEFAULTS.items())
        _state = f"passive ({given}, set by radixlm)"


def describe() -> str:
    """The wait policy libgomp runs with in this process: "passive (...)" (threads sleep
    after at most `SHORT_SPIN` spins at a barrier) or "spin (...)", with the variables or
    the reason behind it."""
    apply_default()
    return _state or ""


def set_by_radixlm() -> dict[str, str]:
    """The variables `apply_default` put into os.environ (empty when it set none): what a
    child process that should run with its own OpenMP defaults must not inherit."""
    describe()
    return dict(DEFAULTS) if _state and _state.endswith("set by radixlm)") else {}


def spins() -> bool:
    """Whether libgomp's threads spin long at barriers before sleeping."""
    return describe().startswith("spin")
