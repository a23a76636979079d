"""What a killed dvc leaves broken in the repository, set aside before the next run.

dvc writes its lock table (`.dvc/tmp/rwlock`: which process reads or writes which stage path) and its experiment
run records (`.dvc/tmp/exps/run/<id>/<id>.run`, `.json`) in place: the file is truncated, then written. A dvc killed
between the two (SIGKILL, an OOM kill, a watcher's SIGTERM while dvc releases its stage locks) leaves the file
empty or cut short, and from then on every dvc command in the repository stops on it ("Unable to read RWLock-file
... JSON structure is corrupted") until someone deletes it by hand. Likewise git's lock files (`.git/index.lock`,
a ref's `.lock`), which a dvc killed while it commits an experiment leaves behind: "the index is locked".

These files describe running processes only (dvc itself drops a table entry whose process is gone). So while no dvc
or git process runs in the repository, a cut-short file or a lock file describes nothing, and
`set_aside_broken_state` renames it to `<name>.cut` / `<name>.stale` (kept for a look); dvc then starts from an
empty table, as on a fresh clone. While a dvc or git process does run there, nothing is touched: `DvcStillRunning`
names the processes and the files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

# dvc's own state files that it writes in place, relative to .dvc/tmp
STATE_PATTERNS = ("rwlock", "*/rwlock", "exps/run/*/*.run", "exps/run/*/*.json")
# git's lock files that dvc's experiment commits take, relative to .git (each exists only while its update runs)
GIT_LOCK_PATTERNS = ("index.lock", "HEAD.lock", "refs/exps/**/*.lock")


class DvcStillRunning(RuntimeError):
    """A state file is broken while a dvc or git process still runs in the repository: it may be that process's."""


def broken_state_files(repo: Path) -> list[Path]:
    """dvc's state files under `repo`/.dvc/tmp that do not parse as a JSON object, and git's lock files."""
    tmp, git = repo / ".dvc" / "tmp", repo / ".git"
    cut = {path for pattern in STATE_PATTERNS for path in tmp.glob(pattern) if not _parses(path)}
    locks = {path for pattern in GIT_LOCK_PATTERNS for path in git.glob(pattern) if path.is_file()}
    return sorted(cut | locks)


def _parses(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_bytes()), dict)
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False


def dvc_and_git_processes(repo: Path) -> list[psutil.Process]:
    """Running dvc and git processes whose working directory is `repo` or under it (this process left out)."""
    root = repo.resolve()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        cmdline, cwd = proc.info["cmdline"] or [], proc.info["cwd"]
        if proc.pid == os.getpid() or not cwd or not _runs_dvc_or_git(cmdline):
            continue
        if Path(cwd) == root or root in Path(cwd).parents:
            found.append(proc)
    return found


def _runs_dvc_or_git(cmdline: list[str]) -> bool:
    """`dvc ...`, `git ...`, `<python> <venv>/bin/dvc ...` or `<python> -m dvc ...`."""
    head = cmdline[:3]
    return any(Path(arg).name in ("dvc", "git") for arg in head) or any(
        a == "-m" and b == "dvc" for a, b in zip(head, head[1:]))


def set_aside_broken_state(repo: Path) -> list[Path]:
    """Rename every broken state file under `repo` (see the module) to `<name>.cut` or, a lock file, to
    `<name>.stale`, and return the new paths; raise `DvcStillRunning` (touching nothing) when one exists while a dvc
    or git process runs in `repo`."""
    broken = broken_state_files(repo)
    if not broken:
        return []
    running = dvc_and_git_processes(repo)
    if running:
        names = ", ".join(f"{p.pid} ({' '.join(p.info['cmdline'][:4])})" for p in running)
        raise DvcStillRunning(f"{', '.join(map(str, broken))}: cut short or locked while dvc or git still runs in "
                              f"{repo}: {names}. Wait for it to end (or end it), then run again.")
    moved = []
    for path in broken:
        target = path.with_name(path.name + (".stale" if path.suffix == ".lock" else ".cut"))
        path.replace(target)
        moved.append(target)
    return moved
