"""Shared by the stage flows: running one from the command line, params validation, the shape of a reported stage,
and the lifetime of a stage's process (`stage_process`): nothing it starts outlives it, it dies with
the `dvc repro` above it, and SIGINT / SIGTERM end it with 130 / 143 after its clean-up ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar


from flows.tracking import LockFileError, dvc_invocation
from pipeline.config import ConfigError, RunConfig, load_config
from pipeline.jsonl import read_problems
from pipeline.services.reaper import spare, watch_this_process
from pipeline.rollout.offered import TOOLS_FOR_TYPE
from pipeline.types import ToolName

T = TypeVar("T")
# What a user can fix (a params file, a path): one line, not a traceback. A flow module adds its own
# (`USER_ERRORS` in flows/<stage>.py), so this module imports nothing a stage does not run.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, LockFileError, FileNotFoundError)


def load_or_exit(params: str | Path) -> RunConfig:
    """Validate the params file before any flow starts; print every error and exit 1 on failure."""
    try:
        return load_config(params)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(1) from None


def tools_needed(problem_file: str | Path) -> tuple[ToolName, ...]:
    """The tools the problems in a file may call (from their types)."""
    types = {p.type for p in read_problems(problem_file)}
    return tuple(sorted({tool for t in types for tool in TOOLS_FOR_TYPE.get(t, ())}))


def run_flow(command: str, flow_fn: Callable[..., object], kwargs: dict[str, Any],
             user_errors: tuple[type[Exception], ...] = USER_ERRORS,
             preflight: Callable[..., object] | None = None) -> None:
    """`python -m flows.<command>` once its arguments parsed (`flows.cli`): the flow inside `stage_process`;
    a user's mistake ends it with one line on stderr and exit 1 (`TAPO_TRACEBACK=1`: the traceback too).
    `preflight(**kwargs)` checks the input before the flow starts, where Prefect would log a traceback."""
    try:
        if preflight is not None:
            preflight(**kwargs)
        with stage_process():
            flow_fn(**kwargs)
    except user_errors as err:
        if os.environ.get("TAPO_TRACEBACK"):
            raise
        print(f"{command}: {err}", file=sys.stderr)
        raise SystemExit(1) from None


class _Signalled:
    number: int | None = None  # the SIGINT/SIGTERM that ended the stage, if one did


class _Watcher:
    process: subprocess.Popen | None = None  # this stage process's watcher, while `stage_process` runs


def watched() -> bool:
    """Whether this process runs under `stage_process`, whose watcher ends what it leaves behind."""
    return _Watcher.process is not None


def ends_on_its_own(pid: int) -> None:
    """`pid` (a `dvc exp run` this stage drives) cleans up after what it started itself: if this process dies,
    its watcher ends everything else first and lets `pid` end on its own (`pipeline.services.reaper.spare`)."""
    if _Watcher.process is not None:  # else no watcher of ours ends anything (a flow run in a Prefect worker)
        spare(_Watcher.process, pid)


def _raise_on_signal(number: int, frame: object) -> None:
    _Signalled.number = number
    raise KeyboardInterrupt if number == signal.SIGINT else SystemExit(128 + number)


@contextmanager
def stage_process() -> Iterator[None]:
    """The body runs as a stage process should (see the module):

    * a watcher process (`pipeline.services.reaper`) ends every process the stage started (Prefect's temporary
      server, services, ranks, engines) when the stage ends, even by SIGKILL, and ends the stage when
      the `dvc` process above it dies (a stage started by hand, e.g. under nohup, outlives its shell);
    * SIGTERM raises SystemExit and SIGINT KeyboardInterrupt, so context managers (MLflow runs marked
      KILLED, services stopped) run; the process then exits 128 + the signal's number, whatever
      exception the signal turned into on its way out (Prefect wraps them)."""
    invocation = dvc_invocation()  # '<host>:<pid>:<start>' of the dvc process above, if any
    watcher = _Watcher.process = watch_this_process((int(invocation.split(":")[1]),) if invocation else ())
    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGINT, _raise_on_signal)
    try:
        yield
    except BaseException:
        if _Signalled.number is None:
            raise
        print(f"stage stopped by {signal.Signals(_Signalled.number).name}", file=sys.stderr, flush=True)
        raise SystemExit(128 + _Signalled.number) from None
    finally:
        _Watcher.process = None
        watcher.returncode = 0  # not waited for: it ends on its own once this process is gone, after the rest
