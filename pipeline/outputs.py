"""Outputs that are whole or absent: directories published by rename, and folders checked writable up front.

A stage killed while writing (SIGKILL, a full disk) must never leave a half-written output where the next
stage, DVC or a resume takes it for a finished one; and a folder it cannot write must stop it before any
compute, not after the first hours of it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path


class OutputNotWritable(OSError):
    """An output folder the stage cannot create or write into (named in the message)."""


def staging_dir(final: Path) -> Path:
    """The empty sibling a directory output is written into before `publish_dir` renames it into place."""
    staging = final.with_name(final.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    return staging


def publish_dir(staging: Path, final: Path) -> Path:
    """Rename a fully written `staging` directory to `final`, replacing what was there (the old one is moved
    aside first and removed after, so `final` is at every moment absent, the old whole one or the new)."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
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
