"""The forked request process: read its job, lock down, run the snippet, report, exit.

Forked from the zygote (`sandbox.code.zygote`), not from the worker, so it starts from a
memory image that holds nothing of any request but its own: the worker puts the job (the
compiled code, its source and limits, marshalled) in a memfd that only this process reads.
It runs between `os.fork()` and `os._exit`, never returning into the zygote's code. The
report is one JSON line on fd 3, written after the snippet finished. A snippet that ends the
process itself (`os._exit(0)`) leaves no report, and the worker says so; a snippet could
also write a fake report to fd 3, but that can only misstate its own outcome, which it
could do as easily by printing, and it reaches nothing outside itself.
"""

from __future__ import annotations

import builtins
import io
import json
import linecache
import marshal
import os
import random
import sys
import traceback
from dataclasses import dataclass
from types import CodeType
from typing import TYPE_CHECKING

import numpy
import sympy.core.random

from sandbox.code import cgroup, jail, policy

if TYPE_CHECKING:
    from sandbox.code.zygote import ZygoteSetup

STATUS_FD = 3


@dataclass(frozen=True)
class ChildJob:
    """What the worker sends one child, through the job memfd."""

    code: CodeType
    source: str
    timeout_s: float
    memory_mb: int
    seed: int | None = None

    def dumps(self) -> bytes:
        return marshal.dumps((self.code, self.source, self.timeout_s, self.memory_mb, self.seed))

    @classmethod
    def loads(cls, data: bytes) -> ChildJob:
        return cls(*marshal.loads(data))


def _read_job(fd: int) -> ChildJob:
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    os.close(fd)
    return ChildJob.loads(data)


def _virtual_memory_bytes(status_fd: int) -> int:
    """VmSize of the zygote, which this fresh child still equals: the memory budget's baseline."""
    for line in os.pread(status_fd, 8192, 0).decode().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmSize missing from the status file")


def limits_for(job: ChildJob, baseline_bytes: int, tmp_size_mib: int) -> jail.ChildLimits:
    return jail.ChildLimits(
        cpu_s=int(job.timeout_s) + 1,
        address_space_bytes=baseline_bytes + job.memory_mb * (1 << 20),
        file_size_bytes=tmp_size_mib << 20,
        open_files=64,
        tasks=32,
    )


def _wire_fds(stdin_fd: int, stdout_fd: int, stderr_fd: int, report_fd: int) -> None:
    # Sources are all >= 3 (the zygote's 0-2 are taken), so 0-2 are filled before fd 3 is.
    os.dup2(stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.dup2(report_fd, STATUS_FD)
    os.closerange(STATUS_FD + 1, 1 << 20)  # the zygote's socket, status file and pidfd: gone


def _fresh_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
    sys.stdout, sys.stderr = out, err
    # typeshed declares them Final; the fresh child rebinds them on purpose, so code reading them writes to its fds
    sys.__stdout__, sys.__stderr__ = out, err  # type: ignore[misc]
    return out, err


def _run(setup: ChildJob, out: io.TextIOWrapper, err: io.TextIOWrapper) -> dict:
    snippet_globals: dict = {"__name__": "__main__", "__builtins__": builtins}
    policy.install_import_guard(snippet_globals)
    linecache.cache[policy.SNIPPET_FILENAME] = (len(setup.source), None, setup.source.splitlines(True), policy.SNIPPET_FILENAME)
    try:
        exec(setup.code, snippet_globals)
        report: dict[str, object] = {"outcome": "finished"}
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


def reseed_inherited_generators(seed: int | None = None) -> None:
    """Fresh entropy for the generators this child inherited from the zygote: numpy's global one and
    sympy's (`random` reseeds itself in every child through CPython's at-fork hook); with the request's
    `seed`, all three start from it instead, so the same snippet and seed print the same thing in every run
    (a trainer's tool answers then repeat; the seed is the request's own, so it carries nothing between requests).

    Done here, in the child, because reseeding in the zygote between children cost more although the
    calls take ~20 us: 0.27 against 0.10 CPU ms a request over no reseeding at all, in the same runs of
    `benchmarks/sandbox_throughput.py` (the zygote's writes land in pages every later child shares). numpy's legacy generator takes a 32-bit integer seed
    without building an array (an array seed runs numpy's conversion machinery in every child): two requests
    share a numpy stream with probability 2**-32, and no request can choose or learn another's seed."""
    if seed is not None:
        random.seed(seed)
        numpy.random.seed(seed & 0xFFFF_FFFF)
        sympy.core.random.seed(seed)
        return
    numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
    sympy.core.random.seed(int.from_bytes(os.urandom(16), "little"))


def child_main(setup: ZygoteSetup, fds: list[int], status_fd: int) -> None:
    """Never returns. Exit code 0/1 mirrors a normal interpreter; the report says why."""
    try:
        job_fd, stdin_fd, stdout_fd, stderr_fd, report_fd = fds
        os.setsid()  # own session and process group, apart from the zygote's
        if setup.cgroup_procs_fd >= 0:  # into the slot's cgroup before any snippet code (fd closed below)
            cgroup.join(setup.cgroup_procs_fd)
        job = _read_job(job_fd)
        reseed_inherited_generators(job.seed)
        limits = limits_for(job, _virtual_memory_bytes(status_fd), setup.tmp_size_mib)
        _wire_fds(stdin_fd, stdout_fd, stderr_fd, report_fd)
        os.chdir(setup.workdir)
        jail.lock_down_child(limits, setup.uid, setup.seccomp_program)
        out, err = _fresh_streams()
    except BaseException as exc:  # noqa: BLE001 - never run a snippet without the lock-down
        os.write(2, f"sandbox lock-down failed: {exc!r}\n".encode())
        os._exit(70)
    report = _run(job, out, err)
    try:
        os.write(STATUS_FD, json.dumps(report).encode() + b"\n")
    finally:
        os._exit(0 if report["outcome"] == "finished" else report.get("exit_code", 1))
