"""One dvc command run from a stage process (`flows.common.stage_process`), so that stopping the process stops the
command cleanly: the experiment driver's `dvc exp run`, the pipeline flow's `dvc repro`.

dvc ignores SIGINT while a stage runs and dies on SIGTERM without releasing its locks (or, signalled while it
rewrites its lock table, leaves the table cut, and every later dvc command in the repository fails on it). So,
stopped on the way (SIGINT / SIGTERM, turned into exceptions by `stage_process`), this ends what dvc started first
(its stage, whose own clean-up runs in its grace, and the stage's processes); dvc sees the stage fail, releases its
locks and ends on its own; only a dvc still running after `2 * GRACE_S` is killed. SIGKILLed, the process cannot
do this itself: the dvc is named to its watcher (`ends_on_its_own`), which then does the same. A process with no
watcher (a flow run a Prefect worker started, outside `stage_process`) starts one for the command
(`pipeline.services.reaper.watch_child`), so a deployment's flow run killed mid-`dvc repro` stops it too.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from flows.common import ends_on_its_own, watched
from pipeline.services.reaper import GRACE_S, descendants, end_all, new_tag, watch_child, with_tag


def run_dvc(line: Sequence[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
            on_line: Callable[[str], None] | None = None) -> int:
    """Run `line` (a dvc command) to its end and return its exit status; with `on_line`, each line it prints
    (stdout and stderr) goes there instead of to this process's output."""
    output = subprocess.PIPE if on_line else None
    tag = None if watched() else new_tag()  # a flow run in a Prefect worker: no stage watcher; dvc gets one
    if tag is not None:
        env = with_tag(os.environ if env is None else env, tag)
    dvc = subprocess.Popen(list(line), cwd=cwd, env=env, stdout=output, stderr=output and subprocess.STDOUT,
                           text=True)
    watcher = watch_child(dvc.pid, tag) if tag is not None else None
    if watcher is None:
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
        if watcher is not None:  # its watch ends within a poll of dvc's end
            _reap(watcher)


def _reap(watcher: subprocess.Popen) -> None:
    if watcher.stdin:
        watcher.stdin.close()
    try:
        watcher.wait(timeout=4 * GRACE_S)
    except subprocess.TimeoutExpired:
        watcher.kill()
        watcher.wait()


def stop(dvc: subprocess.Popen) -> None:
    """End what `dvc` started, then give it `2 * GRACE_S` to end on its own (see the module); kill it after."""
    end_all(descendants(dvc.pid), grace_s=2 * GRACE_S)  # the stage's own clean-up runs in its grace
    try:
        dvc.wait(timeout=2 * GRACE_S)
    except subprocess.TimeoutExpired:
        dvc.kill()
        dvc.wait()
