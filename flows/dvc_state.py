"""What a killed dvc leaves in `.dvc/tmp`, set aside before the next run.

dvc writes its lock table (`rwlock`: which process reads or writes which stage path) and its experiment run
records (`exps/run/<id>/<id>.run`, `.json`) in place: the file is truncated, then written. A dvc killed between the
two (SIGKILL, an OOM kill, a watcher's SIGTERM while dvc releases its stage locks) leaves the file empty or cut
short, and from then on every dvc command in the repository stops on it ("Unable to read RWLock-file ... JSON
structure is corrupted") until someone deletes it by hand.

These files describe running dvc processes only; dvc itself drops an entry whose process is gone. So a file that no
longer parses, while no dvc process runs in the repository, describes nothing, and `set_aside_cut_state` renames it
to `<name>.cut` (kept for a look), after which dvc starts from an empty table as it would on a fresh clone. While a
dvc process does run there, nothing is touched: `DvcStillRunning` names the processes and the files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

# dvc's own state files that it writes in place, relative to .dvc/tmp
STATE_PATTERNS = ("rwlock", "*/rwlock", "exps/run/*/*.run", "exps/run/*/*.json")


class DvcStillRunning(RuntimeError):
    """A state file is cut short while a dvc process still runs in the repository: it may be that process's."""


def cut_state_files(repo: Path) -> list[Path]:
    """dvc's state files under `repo`/.dvc/tmp that do not parse as a JSON object."""
    tmp = repo / ".dvc" / "tmp"
    return sorted({path for pattern in STATE_PATTERNS for path in tmp.glob(pattern) if not _parses(path)})


def _parses(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_bytes()), dict)
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False


def dvc_processes(repo: Path) -> list[psutil.Process]:
    """Running dvc processes whose working directory is `repo` or under it (this process left out)."""
    root = repo.resolve()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        cmdline, cwd = proc.info["cmdline"] or [], proc.info["cwd"]
        if proc.pid == os.getpid() or not cwd or not _runs_dvc(cmdline):
            continue
        if Path(cwd) == root or root in Path(cwd).parents:
            found.append(proc)
    return found


def _runs_dvc(cmdline: list[str]) -> bool:
    """`dvc ...`, `<python> <venv>/bin/dvc ...` or `<python> -m dvc ...`."""
    head = cmdline[:3]
    return any(Path(arg).name == "dvc" for arg in head) or any(
        a == "-m" and b == "dvc" for a, b in zip(head, head[1:]))


def set_aside_cut_state(repo: Path) -> list[Path]:
    """Rename every cut-short dvc state file under `repo` to `<name>.cut` and return the new paths; raise
    `DvcStillRunning` (touching nothing) when one exists while a dvc process runs in `repo`."""
    cut = cut_state_files(repo)
    if not cut:
        return []
    running = dvc_processes(repo)
    if running:
        names = ", ".join(f"{p.pid} ({' '.join(p.info['cmdline'][:4])})" for p in running)
        raise DvcStillRunning(f"dvc's state file(s) {', '.join(map(str, cut))} are cut short while dvc still runs "
                              f"in {repo}: {names}. Wait for it to end (or end it), then run again.")
    moved = []
    for path in cut:
        target = path.with_name(path.name + ".cut")
        path.replace(target)
        moved.append(target)
    return moved
