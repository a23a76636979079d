"""Build locks of C++ ops that no live process holds: cleared before a rank builds or loads its ops.

DeepSpeed builds its CPU collective op (`deepspeed_shm_comm`) on first use with torch's JIT extension loader,
which guards every build (also the no-op build that checks the op is up to date, on every start) with a lock
*file*: created with O_EXCL, held open, removed when done, and waited on by everyone else for as long as it
exists, with no timeout and no word. A rank killed while it holds it (a launcher stopping its ranks, OOM, ^C)
leaves the file behind, and every later run of the checkout hangs silently at start-up.

A lock file is abandoned when no process holds it open: the holder keeps the descriptor from creating the file
until just before removing it. One narrow window is not a holder: a holder that closed its descriptor and is about
to remove the file. So a lock counts as abandoned only when it is still the same file (inode and modification time)
and still unheld after `SETTLE_S`. Holders are looked for in this machine's `/proc`: a lock directory shared with
other machines (a checkout on a network file system, several nodes) could be held from elsewhere, so there a lock
must also be older than `SHARED_MIN_AGE_S` (a build takes minutes, not an hour) before it is cleared. On a machine
shared by several users, a lock another user owns is left alone unless we are root (their processes may be hidden
from us), and a process of the lock's owner whose descriptors we may not read counts as holding it.

A rank clears them before it loads its ops and keeps watching while it does (`build_locks_cleared`): a lock can
also be abandoned while this rank waits on it (another run of the checkout killed in the middle of its build).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

LOCK_NAME = "lock"  # torch.utils.cpp_extension's name for an op's build lock, in the op's build directory
SETTLE_S = 1.0
SHARED_MIN_AGE_S = 3600.0
WATCH_EVERY_S = 10.0

log = logging.getLogger(__name__)


def held_open(path: Path, proc: Path = Path("/proc")) -> bool:
    """Whether a process on this machine has `path` open, or may have: a process running as the file's owner
    whose descriptors we may not look at (another user's, seen from an unprivileged rank) counts as a holder."""
    target = os.path.realpath(path)
    try:
        owner = os.stat(target).st_uid
    except FileNotFoundError:
        return False
    for fd_dir in proc.glob("[0-9]*/fd"):
        try:
            fds = list(fd_dir.iterdir())
        except PermissionError:
            if _runs_as(fd_dir.parent, owner):
                return True
            continue
        except OSError:  # gone
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    return True
            except OSError:
                continue
    return False


def _runs_as(process_dir: Path, uid: int) -> bool:
    try:
        return process_dir.stat().st_uid == uid
    except OSError:  # gone
        return False


def ours_to_judge(path: Path) -> bool:
    """Only root, or the lock's owner, can see every process that could hold it (another user's processes may be
    hidden from us altogether, /proc mounted with `hidepid`): another user's lock is never ours to remove."""
    try:
        return os.geteuid() == 0 or path.stat().st_uid == os.geteuid()
    except FileNotFoundError:
        return False


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def abandoned(locks: Iterable[Path], *, settle_s: float = SETTLE_S, min_age_s: float = 0.0) -> list[Path]:
    """The `locks` that exist, are older than `min_age_s`, and no process held over `settle_s`."""
    first = {p: ident for p in locks
             if (ident := _identity(p)) is not None and ours_to_judge(p) and not held_open(p)}
    first = {p: ident for p, ident in first.items() if time.time() - ident[1] / 1e9 >= min_age_s}
    if not first:
        return []
    time.sleep(settle_s)
    return [p for p, ident in first.items() if _identity(p) == ident and not held_open(p)]


def clear_abandoned_build_locks(extensions_dir: Path, *, shared: bool = False, settle_s: float = SETTLE_S) -> list[Path]:
    """Remove the build locks under `extensions_dir` (one per op: `<op>/lock`) that their holder left behind
    (see the module); returns what was removed. `shared`: the directory may be in use from other machines."""
    if not extensions_dir.is_dir():
        return []
    locks = sorted(extensions_dir.glob(f"*/{LOCK_NAME}"))
    cleared = []
    for lock in abandoned(locks, settle_s=settle_s, min_age_s=SHARED_MIN_AGE_S if shared else 0.0):
        try:
            lock.unlink()
        except FileNotFoundError:  # another rank cleared it first
            continue
        except PermissionError:  # its directory is not ours to write: say so rather than fail the rank
            log.warning("%s is a build lock that no process holds, but this user may not remove it; runs will wait "
                        "on it until its owner does", lock)
            continue
        log.warning("removed %s: a build lock that no process holds (its builder died); without this every run "
                    "would wait on it forever", lock)
        cleared.append(lock)
    return cleared


@contextlib.contextmanager
def build_locks_cleared(extensions_dir: Path, *, shared: bool = False,
                        every_s: float = WATCH_EVERY_S) -> Iterator[None]:
    """Clear abandoned build locks now and every `every_s` until the block ends (it loads or builds the ops)."""
    clear_abandoned_build_locks(extensions_dir, shared=shared)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(every_s):
            clear_abandoned_build_locks(extensions_dir, shared=shared)

    watcher = threading.Thread(target=watch, name="build-lock-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
