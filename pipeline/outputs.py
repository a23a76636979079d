"""Outputs that are whole or absent: directories published by rename, files written beside and renamed, each
made durable (fsync of the file and of its directory) before and after the rename, and folders checked writable
up front.

A stage killed while writing (SIGKILL, a full disk) must never leave a half-written output where the next
stage, DVC or a resume takes it for a finished one; and a folder it cannot write must stop it before any
compute, not after the first hours of it. A rename alone survives a killed process, not a lost machine: after
a power cut or a kernel crash a renamed file whose data was never written back reads as zeros or is empty,
under its final name. So every file is fsynced before it is renamed into place, and the directory that holds
the new name after (as SQLite and PostgreSQL do; `rename` is atomic, not durable).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class OutputNotWritable(OSError):
    """An output folder the stage cannot create or write into (named in the message)."""


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to the disk (any open descriptor of it will do)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root`, then `root` (the deepest first: a directory's entry for a
    child is flushed after the child's own data)."""
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(folder, name))
        fsync_path(Path(folder))


def write_durably(path: Path, data: str | bytes) -> None:
    """`path` holds `data` whole, or its old content: written beside it, fsynced, renamed, the folder fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def write_json_durably(path: Path, obj: Any) -> None:
    """One JSON document (keys sorted, byte-stable), written as `write_durably` writes."""
    write_durably(Path(path), json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def append_durably(path: Path, text: str) -> None:
    """Append `text` and flush it to the disk before returning (a log that a resume reads back)."""
    new = not path.exists()
    with path.open("a", encoding="utf-8", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    if new:
        fsync_path(path.parent)


def staging_dir(final: Path) -> Path:
    """The empty sibling a directory output is written into before `publish_dir` renames it into place."""
    staging = final.with_name(final.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    return staging


def publish_dir(staging: Path, final: Path) -> Path:
    """Rename a fully written `staging` directory to `final`, replacing what was there (the old one is moved
    aside first and removed after, so `final` is at every moment absent, the old whole one or the new). Its
    files are fsynced before the rename and the parent folder after it."""
    fsync_tree(staging)
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def ensure_writable(folders: Iterable[Path]) -> None:
    """Create each folder if needed and write (then remove) a file in it; raise naming the first that fails."""
    for folder in folders:
        folder = Path(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
                pass
        except OSError as err:
            raise OutputNotWritable(f"{folder}: output folder not writable ({err.strerror or err}); "
                                    "nothing was computed") from None
