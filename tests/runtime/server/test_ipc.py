"""Socket directories: each records its owner's pid, and a new server removes the ones
whose owner is gone (a SIGKILLed server cannot remove its own), never a live one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

from radixlm.runtime.server.ipc import IpcPaths, remove_stale_dirs


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process now
    return child.pid


def _socket_dir(root, name: str, pid: int | None) -> str:
    path = root / name
    path.mkdir()
    (path / "scheduler").write_text("")
    if pid is not None:
        (path / "owner.pid").write_text(str(pid))
    return str(path)


def test_only_directories_of_dead_owners_are_removed(tmp_path):
    dead = _dead_pid()
    stale = _socket_dir(tmp_path, "radixlm-stale", dead)
    kept = [
        _socket_dir(tmp_path, "radixlm-live", os.getpid()),
        _socket_dir(tmp_path, "radixlm-starting", None),  # no pid file yet
        _socket_dir(tmp_path, "other-dead", dead),  # not radixlm's
    ]
    (tmp_path / "radixlm-garbled").mkdir()
    (tmp_path / "radixlm-garbled" / "owner.pid").write_text("12ab")
    (tmp_path / "radixlm-file").write_text(str(dead))
    os.symlink(stale, tmp_path / "radixlm-link")
    kept += [str(tmp_path / "radixlm-garbled"), str(tmp_path / "radixlm-file")]

    assert remove_stale_dirs(str(tmp_path)) == [stale]
    assert not os.path.exists(stale)
    assert all(os.path.exists(p) for p in kept)
    assert os.path.islink(tmp_path / "radixlm-link")


def test_a_killed_servers_directory_is_removed_at_the_next_start(tmp_path, monkeypatch):
    code = "from radixlm.runtime.server.ipc import IpcPaths; print(IpcPaths.create().directory)"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen(
        [sys.executable, "-c", code + "; import time; time.sleep(60)"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        crashed = child.stdout.readline().strip()
        assert open(os.path.join(crashed, "owner.pid")).read() == str(child.pid)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        live = IpcPaths.create()  # the owner still runs: its directory stays
        assert os.path.isdir(crashed)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()

    fresh = IpcPaths.create()
    assert not os.path.exists(crashed)
    assert os.path.isdir(live.directory) and os.path.isdir(fresh.directory)
    assert open(os.path.join(fresh.directory, "owner.pid")).read() == str(os.getpid())
    live.remove()
    fresh.remove()
    assert os.listdir(tmp_path) == []
