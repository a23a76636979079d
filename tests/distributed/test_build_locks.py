"""A rank that dies while it builds or checks DeepSpeed's C++ op leaves torch's build lock behind; no later run may
hang on it (`pipeline.distributed.build_locks`). The locks here are made the way torch makes them (`FileBaton`),
by real processes that are then killed, or kept alive to show a live holder's lock is never touched."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from torch.utils.file_baton import FileBaton

from pipeline.distributed.build_locks import (SHARED_MIN_AGE_S, build_locks_cleared, clear_abandoned_build_locks,
                                              held_open)
from pipeline.distributed.launch import on_this_machine, run_ranks

HOLD = textwrap.dedent("""
    import sys, time
    from torch.utils.file_baton import FileBaton
    baton = FileBaton(sys.argv[1])
    assert baton.try_acquire()
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    baton.release()
""")


def hold(lock: Path, seconds: float, user: int | None = None) -> subprocess.Popen:
    """A process holding `lock` as torch's extension loader does, for `seconds` (then it releases it)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True,
                              user=user)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def abandon(lock: Path, user: int | None = None) -> None:
    """A holder killed mid-build: its lock stays."""
    holder = hold(lock, 600, user)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock.exists() and not held_open(lock)


def test_a_dead_holders_lock_is_cleared_and_a_live_holders_kept(tmp_path: Path) -> None:
    dead, live = tmp_path / "dead_op" / "lock", tmp_path / "live_op" / "lock"
    abandon(dead)
    holder = hold(live, 600)
    try:
        assert held_open(live)
        assert clear_abandoned_build_locks(tmp_path, settle_s=0.05) == [dead]
        assert not dead.exists() and live.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_released_while_it_is_judged_is_left_to_its_holder(tmp_path: Path) -> None:
    """Holders come and go during the settle time (ranks check the op on every start): none may lose its lock to
    us, and we must not fail when it is gone."""
    lock = tmp_path / "op" / "lock"
    for _ in range(5):
        holder = hold(lock, 0.3)
        assert clear_abandoned_build_locks(tmp_path, settle_s=0.6) == []
        assert holder.wait(30) == 0, "the holder could not remove its own lock"


def test_a_shared_directory_clears_only_old_locks(tmp_path: Path) -> None:
    lock = tmp_path / "op" / "lock"
    abandon(lock)
    assert clear_abandoned_build_locks(tmp_path, shared=True, settle_s=0.05) == []
    old = time.time() - SHARED_MIN_AGE_S - 60
    os.utime(lock, (old, old))
    assert clear_abandoned_build_locks(tmp_path, shared=True, settle_s=0.05) == [lock]


def _forked_as(uid: int, work: Callable[[int], None]) -> tuple[int, int]:
    """Fork a child that switches to `uid` and runs `work(pipe)`; the interpreter here may not be one other users
    can start. Returns the child's pid and the pipe's read end."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            signal.alarm(120)  # a child of a threaded test process must never outlive a hang
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            work(write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    return pid, read_end


def hold_as(lock: Path, uid: int) -> int:
    """A process of user `uid` holding `lock` as torch's extension loader does, until killed; returns its pid."""
    def work(pipe: int) -> None:
        assert FileBaton(str(lock)).try_acquire()
        os.write(pipe, b"held")
        time.sleep(600)

    pid, answer = _forked_as(uid, work)
    with os.fdopen(answer, "rb") as reply:
        assert reply.read(4) == b"held"
    return pid


def clear_as(extensions_dir: Path, uid: int) -> list[str]:
    """What an unprivileged rank of user `uid` removes."""
    def work(pipe: int) -> None:
        cleared = clear_abandoned_build_locks(extensions_dir, settle_s=0.05)
        os.write(pipe, json.dumps([str(p) for p in cleared]).encode())

    pid, answer = _forked_as(uid, work)
    with os.fdopen(answer, "rb") as reply:
        text = reply.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and text, "the rank failed"
    return json.loads(text)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs two other users: holders and a rank run as uids 65534, 65533")
def test_another_users_lock_is_left_to_them_unless_we_are_root() -> None:
    """On a machine shared by several users, an unprivileged rank may not see another user's processes (nor their
    descriptors): their lock, held or abandoned, must survive it, even where the directory would let it be removed.
    Root sees every process and clears the abandoned one."""
    shared = Path(tempfile.mkdtemp(prefix="shared_torch_extensions_"))
    holders = []
    try:
        shared.chmod(0o777)
        held, dead = shared / "held_op" / "lock", shared / "dead_op" / "lock"
        for lock in (held, dead):
            lock.parent.mkdir()
            lock.parent.chmod(0o777)  # a team's build cache (umask 002): anyone could remove the lock
            holders.append(hold_as(lock, 65534))
        os.kill(holders[1], signal.SIGKILL)
        os.waitpid(holders.pop(), 0)
        assert dead.exists()
        assert clear_as(shared, 65533) == [] and held.exists() and dead.exists()
        assert clear_abandoned_build_locks(shared, settle_s=0.05) == [dead]  # root sees every process
        assert held.exists()
        # the rank's own abandoned lock in a directory it may not write: left, with a warning, and the rank goes on
        own = shared / "own_op" / "lock"
        own.parent.mkdir()
        own.parent.chmod(0o777)
        holders.append(hold_as(own, 65533))
        os.kill(holders[-1], signal.SIGKILL)
        os.waitpid(holders.pop(), 0)
        own.parent.chmod(0o755)
        assert clear_as(shared, 65533) == [] and own.exists()
    finally:
        for pid in holders:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        shutil.rmtree(shared)


def test_a_lock_abandoned_while_a_rank_waits_is_cleared_by_its_watch(tmp_path: Path) -> None:
    lock = tmp_path / "op" / "lock"
    with build_locks_cleared(tmp_path, every_s=0.2):
        abandon(lock)
        deadline = time.monotonic() + 30
        while lock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not lock.exists()


def test_ranks_start_past_a_lock_left_by_a_rank_killed_mid_build(tmp_path: Path, repo_root: Path) -> None:
    """Two DeepSpeed ranks on gloo start (they load `deepspeed_shm_comm`) although its build lock was abandoned;
    before, they waited on it for ever. A copy of the built op keeps the shared build directory out of it."""
    extensions = tmp_path / "torch_extensions"
    built = repo_root / ".cache" / "torch_extensions"
    if (built / "deepspeed_shm_comm").is_dir():
        shutil.copytree(built, extensions, ignore=shutil.ignore_patterns("lock"))
    abandon(extensions / "deepspeed_shm_comm" / "lock")
    env = dict(os.environ) | {"PYTHONPATH": str(repo_root), "TORCH_EXTENSIONS_DIR": str(extensions),
                              "OMP_NUM_THREADS": "1"}
    result = run_ranks(["-m", "tests.distributed.start_worker", str(tmp_path)], on_this_machine(2),
                       log_dir=tmp_path / "rank_logs", env=env, on_line=lambda _: None, timeout_s=900)
    assert result.returncode == 0, f"ranks failed (launcher exit {result.returncode}):\n{result.tail}"
    assert sorted(p.name for p in tmp_path.glob("started.*")) == ["started.0", "started.1"]
    assert not (extensions / "deepspeed_shm_comm" / "lock").exists()

