"""One dvc command run from a stage process (`flows.common.stage_process`), so that stopping the process stops the
command cleanly: the experiment driver's `dvc exp run`, the pipeline flow's `dvc repro`.

dvc ignores SIGINT while a stage runs and dies on SIGTERM without releasing its locks (or, signalled while it
rewrites its lock table, leaves the table cut, and every later dvc command in the repository fails on it). So,
stopped on the way (SIGINT / SIGTERM, turned into exceptions by `stage_process`), this ends what dvc started first
(its stage, whose own clean-up runs in its grace, and the stage's processes); dvc sees the stage fail, releases its
locks and ends on its own; only a dvc still running after `2 * GRACE_S` is killed. SIGKILLed, the process cannot
do this itself: the dvc is named to its watcher (`ends_on_its_own`), which then does the same.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from flows.common import ends_on_its_own
from pipeline.services.reaper import GRACE_S, descendants, end_all


def run_dvc(line: Sequence[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
            on_line: Callable[[str], None] | None = None) -> int:
    """Run `line` (a dvc command) to its end and return its exit status; with `on_line`, each line it prints
    (stdout and stderr) goes there instead of to this process's output."""
    output = subprocess.PIPE if on_line else None
    dvc = subprocess.Popen(list(line), cwd=cwd, env=env, stdout=output, stderr=output and subprocess.STDOUT,
                           text=True)
    ends_on_its_own(dvc.pid)
    try:
        if on_line is not None and dvc.stdout is not None:
            for text in dvc.stdout:
                on_line(text.rstrip("\n"))
        return dvc.wait()
    except BaseException:
        stop(dvc)
        raise
    finally:
        if dvc.stdout:
            dvc.stdout.close()


def stop(dvc: subprocess.Popen) -> None:
    """End what `dvc` started, then give it `2 * GRACE_S` to end on its own (see the module); kill it after."""
    end_all(descendants(dvc.pid), grace_s=2 * GRACE_S)  # the stage's own clean-up runs in its grace
    try:
        dvc.wait(timeout=2 * GRACE_S)
    except subprocess.TimeoutExpired:
        dvc.kill()
        dvc.wait()
