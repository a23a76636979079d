"""Shared by the stage flows: running one from the command line, params validation, the shape of a reported stage,
and the lifetime of a stage's process (`stage_process`): nothing it starts outlives it, it dies with
the `dvc repro` above it, and SIGINT / SIGTERM end it with 130 / 143 after its clean-up ran, promptly: after the
signal no API is retried (`stop_retrying`; Prefect's temporary server, which a Ctrl-C ends with the stage, was
retried for ~75 s per state the stage reported), and the services stop in parallel, each within a bounded grace
(`flows.services`).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar


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
    at: float = 0.0  # when (time.monotonic)


# A signal repeated within this many seconds of the first is not raised again: the clean-up it started is under
# way and bounded, and an exception in the middle of it (the watcher's SIGTERM once `dvc` died of the same
# signal, a second Ctrl-C) would cut it wherever it stood. Later, a repeat raises again (a clean-up that hangs).
REPEAT_GRACE_S = 10.0


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


# After a signal every call to an API gets one try: the clean-up reports the stage's end, it does not wait for a
# server that may be gone (a terminal's Ctrl-C reaches Prefect's temporary server too, which shares the stage's
# process group). Prefect reads its retry count from its settings object at every request (five retries, 2 + 4 + 8
# + 16 + 32 s of back-off, per request), MLflow from the environment (seven, and a 120 s timeout).
NO_RETRIES = {"PREFECT_CLIENT_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def stop_retrying() -> None:
    """From now on no API call of this process is retried (see `NO_RETRIES`); Prefect's settings objects that are
    already built (the global one and the current context's) are changed in place, as nothing rebuilds them."""
    os.environ.update(NO_RETRIES)
    context = sys.modules.get("prefect.context")  # not imported here: a stage without Prefect has none to change
    if context is None:
        return
    current = context.SettingsContext.get()
    for holder in {id(c): c for c in (getattr(context, "GLOBAL_SETTINGS_CONTEXT", None), current) if c}.values():
        try:
            holder.settings.client.max_retries = 0
        except (AttributeError, TypeError, ValueError):  # settings Prefect made read-only: the signal still ends us
            pass


def _end_now(code: int) -> NoReturn:
    """Exit with `code` once every exit handler ran (atexit's, in their order), skipping the interpreter's
    finalisation (see `stage_process`)."""
    atexit._run_exitfuncs()  # runs each handler once and clears them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said there
            pass
    os._exit(code)


def _first_signal(number: int) -> bool:
    """Note signal `number`; False for a repeat within `REPEAT_GRACE_S` of the first (see there)."""
    if _Signalled.number is not None and time.monotonic() - _Signalled.at < REPEAT_GRACE_S:
        return False
    _Signalled.number, _Signalled.at = number, time.monotonic()
    stop_retrying()
    return True


def _raise_on_signal(number: int, frame: object) -> None:
    if _first_signal(number):
        raise KeyboardInterrupt if number == signal.SIGINT else SystemExit(128 + number)


def _through_prefect() -> None:
    """Have the SIGTERM handler Prefect installs while a flow runs note the signal first (no retries from then on,
    repeats not raised again): Prefect owns SIGTERM during a flow run and reports the crash before handing the
    signal back to `_raise_on_signal`, and it reported it with its retries against a server that the same signal
    may have ended (SIGTERM to the process group). Prefect looks its handler up by this module attribute."""
    engine = sys.modules.get("prefect.utilities.engine")
    original = getattr(engine, "_prefect_sigterm_handler", None)
    if original is None or getattr(original, "notes_the_signal", False):
        return

    def noted(number: int, *args: object) -> None:
        if _first_signal(number):
            original(number, *args)

    noted.notes_the_signal = True  # type: ignore[attr-defined]
    engine._prefect_sigterm_handler = noted  # type: ignore[union-attr]


@contextmanager
def stage_process() -> Iterator[None]:
    """The body runs as a stage process should (see the module):

    * a watcher process (`pipeline.services.reaper`) ends every process the stage started (Prefect's temporary
      server, services, ranks, engines) when the stage ends, even by SIGKILL, and ends the stage when
      the `dvc` process above it dies (a stage started by hand, e.g. under nohup, outlives its shell);
    * SIGTERM raises SystemExit and SIGINT KeyboardInterrupt, so context managers (MLflow runs marked
      KILLED, services stopped) run; the process then exits 128 + the signal's number, whatever
      exception the signal turned into on its way out (Prefect wraps them), once the exit handlers ran
      (`_end_now`: Prefect's server stopped, logs flushed) and without the interpreter's own finalisation, which
      took seconds on a loaded machine for what the stage had imported, and which nothing of a stopped stage needs."""
    invocation = dvc_invocation()  # '<host>:<pid>:<start>' of the dvc process above, if any
    watcher = _Watcher.process = watch_this_process((int(invocation.split(":")[1]),) if invocation else ())
    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGINT, _raise_on_signal)
    _through_prefect()
    try:
        yield
    except BaseException:
        if _Signalled.number is None:
            raise
        print(f"stage stopped by {signal.Signals(_Signalled.number).name}", file=sys.stderr, flush=True)
        _end_now(128 + _Signalled.number)
    finally:
        _Watcher.process = None
        watcher.returncode = 0  # not waited for: it ends on its own once this process is gone, after the rest
