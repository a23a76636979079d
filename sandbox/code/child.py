"""The forked request process: lock down, run the snippet, report, exit.

Runs between `os.fork()` in the worker and `os._exit`; it never returns into the worker's
code. The report is one JSON line on fd 3, written after the snippet finished. A snippet
that ends the process itself (`os._exit(0)`) leaves no report, and the worker says so;
a snippet could also write a fake report to fd 3, but that can only misstate its own
outcome, which it could do as easily by printing, and it reaches nothing outside itself.
"""

from __future__ import annotations

import builtins
import io
import json
import linecache
import os
import sys
import traceback
from dataclasses import dataclass
from types import CodeType

from sandbox.code import jail, policy

STATUS_FD = 3


@dataclass(frozen=True)
class ChildSetup:
    """Everything the child needs, prepared by the worker before the fork."""

    code: CodeType
    source: str
    stdin_fd: int
    stdout_fd: int
    stderr_fd: int
    status_fd: int
    limits: jail.ChildLimits
    uid: int | None
    seccomp_program: object
    workdir: str


def _wire_fds(setup: ChildSetup) -> None:
    # Sources are all >= 3 (the worker's 0-2 are taken), so 0-2 are filled before fd 3 is.
    os.dup2(setup.stdin_fd, 0)
    os.dup2(setup.stdout_fd, 1)
    os.dup2(setup.stderr_fd, 2)
    os.dup2(setup.status_fd, STATUS_FD)
    os.closerange(STATUS_FD + 1, 1 << 20)  # the worker's channel, pipes, /proc handle: gone


def _fresh_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
    sys.stdout, sys.stderr = out, err
    sys.__stdout__, sys.__stderr__ = out, err
    return out, err


def _run(setup: ChildSetup, out: io.TextIOWrapper, err: io.TextIOWrapper) -> dict:
    snippet_globals: dict = {"__name__": "__main__", "__builtins__": builtins}
    policy.install_import_guard(snippet_globals)
    linecache.cache[policy.SNIPPET_FILENAME] = (len(setup.source), None, setup.source.splitlines(True), policy.SNIPPET_FILENAME)
    try:
        exec(setup.code, snippet_globals)
        report = {"outcome": "finished"}
    except SystemExit as exc:
        code = exc.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        report = {"outcome": "exit", "exit_code": exit_code & 0xFF,
                  "error": f"SystemExit: {code}"}
    except BaseException as exc:  # noqa: BLE001 - the snippet's failure is the answer
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # hide this frame
        try:
            traceback.print_exception(type(exc), exc, tb, file=err)
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        except BaseException:  # noqa: BLE001 - e.g. a __str__ that raises or recurses
            last = type(exc).__name__
        report = {"outcome": "exception", "error": last, "memory": isinstance(exc, MemoryError)}
    for stream in (out, err):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the snippet may have closed or broken it
            pass
    return report


def child_main(setup: ChildSetup) -> None:
    """Never returns. Exit code 0/1 mirrors a normal interpreter; the report says why."""
    try:
        os.setsid()  # own process group: the worker kills the whole group at the deadline
        _wire_fds(setup)
        os.chdir(setup.workdir)
        jail.lock_down_child(setup.limits, setup.uid, setup.seccomp_program)
        out, err = _fresh_streams()
    except BaseException as exc:  # noqa: BLE001 - never run a snippet without the lock-down
        os.write(2, f"sandbox lock-down failed: {exc!r}\n".encode())
        os._exit(70)
    report = _run(setup, out, err)
    try:
        os.write(STATUS_FD, json.dumps(report).encode() + b"\n")
    finally:
        os._exit(0 if report["outcome"] == "finished" else report.get("exit_code", 1))
