"""The worker's side of one request: pipes, the watch loop, files, and what the run amounts to.

`watch` polls the child's output pipes and its pidfd in one loop, so output is drained
while the child runs (a full pipe would otherwise stall it until the deadline) and the
output cap is enforced as bytes arrive. At the deadline or over the cap it SIGKILLs the
child through its pidfd (no pid reuse race). The child is pid 1 of its own PID namespace
and the filter forbids creating processes, so the kill ends its threads and anything else
in that namespace; a child that still has not exited `REAP_TIMEOUT_S` later is reported
as unreaped, and the worker retires.

Every descriptor a request opens is owned by a `ChildPipes` (or the caller's ExitStack)
from the moment it exists, so no error path leaves one open. Input and output files are
bounded in count, depth and bytes (`FileLimits`) and deduplicated by normalised path.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import time
from dataclasses import dataclass, field

from sandbox.code.messages import Job, Outcome

_READ_CHUNK = 1 << 16


@dataclass
class ChildPipes:
    """The request's four pipes. `close()` closes whatever is still open; safe to call twice."""

    stdin_r: int = -1
    stdout_r: int = -1
    stdout_w: int = -1
    stderr_r: int = -1
    stderr_w: int = -1
    status_r: int = -1
    status_w: int = -1

    @classmethod
    def open(cls, stdin: bytes) -> ChildPipes:
        pipes = cls()
        try:
            pipes.stdin_r, stdin_w = os.pipe()
            try:
                # The server caps stdin at 64 KiB, the default pipe capacity; non-blocking so that a
                # larger input is cut at the capacity instead of hanging the worker.
                os.set_blocking(stdin_w, False)
                os.write(stdin_w, stdin)
            except BlockingIOError:
                pass
            finally:
                os.close(stdin_w)
            pipes.stdout_r, pipes.stdout_w = os.pipe()
            pipes.stderr_r, pipes.stderr_w = os.pipe()
            pipes.status_r, pipes.status_w = os.pipe()
        except BaseException:
            pipes.close()
            raise
        return pipes

    def child_ends(self) -> list[int]:
        return [self.stdin_r, self.stdout_w, self.stderr_w, self.status_w]

    def close_child_ends(self) -> None:
        for name in ("stdin_r", "stdout_w", "stderr_w", "status_w"):
            self._close(name)

    def close(self) -> None:
        for name in ("stdin_r", "stdout_r", "stdout_w", "stderr_r", "stderr_w", "status_r", "status_w"):
            self._close(name)

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd >= 0:
            setattr(self, name, -1)
            os.close(fd)


@dataclass
class ChildRun:
    """Raw facts about a finished child, before classification."""

    wait_status: int = 0
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    report: bytearray = field(default_factory=bytearray)
    timed_out: bool = False
    over_output: bool = False
    exited: bool = True


REAP_TIMEOUT_S = 5.0  # a SIGKILLed process that is still there after this is reported, not waited for


def _drain(fd: int, into: bytearray, cap: int) -> bool:
    """Read what is available; False at end of file. Keeps at most `cap` bytes (+1 to detect overflow)."""
    try:
        chunk = os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        return True
    if not chunk:
        return False
    room = cap + 1 - len(into)
    if room > 0:
        into += chunk[:room]
    return True


def kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass


def exited_within(pidfd: int, timeout_s: float) -> bool:
    return bool(select.select([pidfd], [], [], timeout_s)[0])


def watch(pidfd: int, pipes: ChildPipes, deadline: float, output_cap: int) -> ChildRun:
    """Supervise the child until it exits or is killed (then wait for it, at most REAP_TIMEOUT_S)."""
    run = ChildRun()
    buffers = {pipes.stdout_r: run.stdout, pipes.stderr_r: run.stderr, pipes.status_r: run.report}
    poller = select.poll()
    for fd in (*buffers, pidfd):
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    exited = False
    while not exited:
        remaining_ms = (deadline - time.monotonic()) * 1000
        if remaining_ms <= 0:
            run.timed_out = True
            break
        for fd, _ in poller.poll(max(1, int(remaining_ms) + 1)):
            if fd == pidfd:
                exited = True
            elif not _drain(fd, buffers[fd], output_cap):
                poller.unregister(fd)
        if len(run.stdout) > output_cap or len(run.stderr) > output_cap:
            run.over_output = True
            break
    if not exited:
        kill(pidfd)
        run.exited = exited_within(pidfd, REAP_TIMEOUT_S)
    for fd, buffer in buffers.items():  # the writers are gone: read what is left, up to EOF
        while len(buffer) <= output_cap and select.select([fd], [], [], 0)[0] and _drain(fd, buffer, output_cap):
            pass
    run.over_output = run.over_output or max(len(run.stdout), len(run.stderr)) > output_cap
    return run


def _text(data: bytearray, cap: int) -> str:
    return bytes(data[:cap]).decode("utf-8", errors="replace")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _unreported_end(wait_status: int) -> tuple[str, str, int | None]:
    """Status, error and return code for a child that ended without writing its report."""
    if os.WIFEXITED(wait_status):
        code = os.WEXITSTATUS(wait_status)
        return "error", f"SystemExit: the snippet ended the process itself (os._exit({code}))", code
    sig = os.WTERMSIG(wait_status)
    # A snippet is pid 1 of its namespace, and the kernel does not deliver a default-action
    # SIGXCPU to such a process: its CPU limit ends it at the hard limit, with SIGKILL. Nothing
    # else sends that signal (the worker's own kills are classified before this).
    if sig in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout", "TimeoutError: CPU time limit exceeded", None
    if sig == signal.SIGSEGV:
        return "error", "Segmentation fault (SIGSEGV): often a C stack overflow from very deep recursion", -sig
    return "error", f"Killed by {_signal_name(sig)}", -sig


def classify(run: ChildRun, job: Job, duration_ms: float, fetched: dict[str, str], cap: int) -> Outcome:
    stdout, stderr = _text(run.stdout, cap), _text(run.stderr, cap)
    if run.timed_out:
        return Outcome("timeout", stdout, stderr, f"TimeoutError: the snippet ran longer than {job.timeout_s:g} s",
                       duration_ms, None, fetched)
    if run.over_output:
        return Outcome("output_limit", stdout, stderr, f"OutputLimitExceeded: more than {cap} bytes of output",
                       duration_ms, None, fetched)
    try:
        report = json.loads(bytes(run.report).splitlines()[0]) if run.report else None
    except (ValueError, IndexError):
        report = None
    if not isinstance(report, dict) or report.get("outcome") not in ("finished", "exception", "exit"):
        status, error, code = _unreported_end(run.wait_status)
        return Outcome(status, stdout, stderr, error, duration_ms, code, fetched)
    if report["outcome"] == "finished":
        return Outcome("ok", stdout, stderr, None, duration_ms, 0, fetched)
    status = "memory" if report.get("memory") else "error"
    return Outcome(status, stdout, stderr, str(report.get("error")), duration_ms, int(report.get("exit_code", 1)), fetched)


def empty_directory(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)
