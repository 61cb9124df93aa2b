"""radixlm.omp_policy: `import radixlm` makes libgomp's threads wait passively, unless the
user chose a policy or libgomp was loaded first. Each case runs in a fresh interpreter,
since libgomp reads the variables once, when it loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SHOW = (
    "import os, sys, radixlm.omp_policy as p; "
    "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT')); "
    "print(p.describe()); print(p.spins())"
)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    drop = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "RADIXLM_OMP_DEFAULTS")
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
        check=True, timeout=120,
    )  # fmt: skip


def test_import_sets_passive_before_torch_loads():
    out = _run("import radixlm, sys; " + SHOW + "; print('torch' in sys.modules)")
    policy, described, spins, torch_loaded = out.stdout.splitlines()
    assert policy == "PASSIVE 1000"
    assert described == "passive (GOMP_SPINCOUNT=1000, OMP_WAIT_POLICY=PASSIVE, set by radixlm)"
    assert spins == "False"
    assert torch_loaded == "False"  # `import radixlm` stays torch-free


def test_a_child_knows_radixlm_chose_its_inherited_policy():
    # As the server's scheduler process: spawned with the parent's environment.
    code = (
        "import os, subprocess, sys, radixlm; "
        "print(subprocess.run([sys.executable, '-c', 'import radixlm.omp_policy as p; "
        "print(p.describe()); print(sorted(p.set_by_radixlm()))'], capture_output=True, "
        "text=True).stdout)"
    )
    described, inherited = _run(code).stdout.splitlines()[:2]
    assert described == "passive (GOMP_SPINCOUNT=1000, OMP_WAIT_POLICY=PASSIVE, set by radixlm)"
    assert inherited == str(sorted(["GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "RADIXLM_OMP_DEFAULTS"]))


def test_libgomp_runs_with_the_policy_radixlm_set():
    # OMP_DISPLAY_ENV makes libgomp print the settings it read when it loaded.
    out = _run("import radixlm, torch; torch.ones(2).sum()", OMP_DISPLAY_ENV="VERBOSE")
    assert "GOMP_SPINCOUNT = '1000'" in out.stderr
    default = _run("import torch; torch.ones(2).sum()", OMP_DISPLAY_ENV="VERBOSE")
    assert "GOMP_SPINCOUNT = '300000'" in default.stderr


@pytest.mark.parametrize(
    ("env", "policy", "described", "spins"),
    [
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE None", "spin (OMP_WAIT_POLICY=ACTIVE)", "True"),
        (
            {"OMP_WAIT_POLICY": "passive"},
            "passive None",
            "passive (OMP_WAIT_POLICY=passive)",
            "False",
        ),
        ({"GOMP_SPINCOUNT": "100000"}, "None 100000", "spin (GOMP_SPINCOUNT=100000)", "True"),
        ({"GOMP_SPINCOUNT": "1k"}, "None 1k", "passive (GOMP_SPINCOUNT=1k)", "False"),
        ({"GOMP_SPINCOUNT": "infinite"}, "None infinite", "spin (GOMP_SPINCOUNT=infinite)", "True"),
        (
            {"GOMP_SPINCOUNT": "300000", "OMP_WAIT_POLICY": "PASSIVE"},
            "PASSIVE 300000",
            "spin (GOMP_SPINCOUNT=300000, OMP_WAIT_POLICY=PASSIVE)",
            "True",
        ),
        # libgomp's parsing: a minus sign wraps to the largest count; an invalid count
        # falls back to OMP_WAIT_POLICY (unset: libgomp's 300000).
        ({"GOMP_SPINCOUNT": "-1"}, "None -1", "spin (GOMP_SPINCOUNT=-1)", "True"),
        ({"GOMP_SPINCOUNT": "1e3"}, "None 1e3", "spin (GOMP_SPINCOUNT=1e3)", "True"),
        (
            {"GOMP_SPINCOUNT": "abc", "OMP_WAIT_POLICY": "PASSIVE"},
            "PASSIVE abc",
            "passive (GOMP_SPINCOUNT=abc, OMP_WAIT_POLICY=PASSIVE)",
            "False",
        ),
    ],
)
def test_a_users_choice_is_kept(env, policy, described, spins):
    out = _run("import radixlm; " + SHOW, **env)
    assert out.stdout.splitlines() == [policy, described, spins]


def test_torch_imported_first_keeps_the_spin_default_and_says_so():
    out = _run("import torch, radixlm; " + SHOW)
    policy, described, spins = out.stdout.splitlines()
    assert policy == "None None"
    assert described.startswith("spin (libgomp's default") and spins == "True"


@pytest.mark.slow
def test_a_variable_set_after_libgomp_loaded_is_not_believed():
    code = "import os, torch; os.environ['OMP_WAIT_POLICY'] = 'PASSIVE'; " + SHOW
    described, spins = _run(code).stdout.splitlines()[1:]
    assert described.startswith("spin (libgomp's default") and spins == "True"


def test_this_test_process_runs_with_the_policy_conftest_set():
    from radixlm import omp_policy

    assert omp_policy.describe().startswith(omp_policy.policy_kind(os.environ))


def test_multithreaded_engine_warns_when_threads_spin():
    code = (
        "import logging, torch, radixlm; logging.basicConfig(level=logging.WARNING); "
        "from radixlm.config import ServerArgs; "
        "from radixlm.runtime.server.stack import build_stack; "
        "build_stack(ServerArgs(model='smollm2-135m', num_threads=2, "
        "max_total_tokens=256))"
    )
    out = _run(code)
    assert "OpenMP wait policy: spin (libgomp's default" in out.stderr
    quiet = _run(code.replace("torch, radixlm", "radixlm, torch"))
    assert "OpenMP wait policy" not in quiet.stderr


@pytest.mark.parametrize(
    "env",
    [
        {"GOMP_SPINCOUNT": "-1"},
        {"GOMP_SPINCOUNT": "1e3"},
        {"GOMP_SPINCOUNT": "10k"},
        {"GOMP_SPINCOUNT": "2M"},
        {"GOMP_SPINCOUNT": "infinite"},
        {"GOMP_SPINCOUNT": "abc", "OMP_WAIT_POLICY": "PASSIVE"},
        {"OMP_WAIT_POLICY": "active"},
    ],
)
def test_spin_count_agrees_with_what_libgomp_read(env):
    import re

    from radixlm import omp_policy

    out = _run("import torch; torch.ones(2).sum()", OMP_DISPLAY_ENV="VERBOSE", **env)
    read = int(re.search(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr).group(1))
    ours = omp_policy.spin_count(env)
    assert ours == read or (ours == float("inf") and read >= 2**63), (ours, read)


# Threads of this process, and a wait until their count reaches `n` (a freed OpenMP worker
# leaves /proc/self/task once it has exited).
TASKS = """
import os, time
def tasks():
    return len(os.listdir('/proc/self/task'))
def settle(n):
    end = time.monotonic() + 10
    while tasks() != n and time.monotonic() < end:
        time.sleep(0.01)
    return tasks()
"""


def test_release_thread_pool_stops_this_threads_openmp_workers():
    code = TASKS + (
        "import radixlm.omp_policy as p, torch\n"
        "torch.set_num_threads(2)\n"
        "x = torch.rand(1 << 22)\n"
        "base = tasks(); x.exp(); grown = tasks() - base\n"  # this thread's pool: 1 worker
        "freed = p.release_thread_pool()\n"
        "print(grown, freed, settle(base) - base)\n"
        "x.exp(); print(tasks() - base)\n"  # a later region starts a new pool
    )
    lines = _run(code).stdout.splitlines()
    assert lines == ["1 True 0", "1"]


def test_an_engine_leaves_no_openmp_pool_on_the_thread_that_built_it():
    # Its steps may run on another thread (EngineBackend's driver): a pool left here
    # would push libgomp past its thread limit, where barriers stop spinning. Built, it
    # leaves none; run here, it starts one (its one worker), which an EngineBackend over it
    # stops.
    code = TASKS + (
        "import radixlm, radixlm.omp_policy as p\n"
        "from radixlm.lang.backend.engine import EngineBackend\n"
        "e = radixlm.Engine(model='smollm2-135m', num_threads=2, max_total_tokens=1024)\n"
        "base = tasks(); p.release_thread_pool(); time.sleep(0.5); print(tasks() - base)\n"
        "e.generate('Hi', {'max_new_tokens': 2}); ran = tasks()\n"
        "EngineBackend(e); time.sleep(0.5); print(ran - tasks())\n"
        "e.shutdown()\n"
    )
    assert _run(code).stdout.split() == ["0", "1"]
