"""The worker's side of one request: pipes, the watch loop, and what the run amounts to.

`watch` polls the child's output pipes and its pidfd in one loop, so output is drained
while the child runs (a full pipe would otherwise stall it until the deadline) and the
output cap is enforced as bytes arrive. At the deadline or over the cap it SIGKILLs the
child's whole process group. Because the seccomp filter forbids creating processes, the
group is the child and its threads: nothing can outlive the kill.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import time
from dataclasses import dataclass, field

from sandbox.code.protocol import Job, Outcome

_READ_CHUNK = 1 << 16
_MAX_FETCH_BYTES = 1 << 20


@dataclass
class ChildPipes:
    stdin_r: int
    stdout_r: int
    stdout_w: int
    stderr_r: int
    stderr_w: int
    status_r: int
    status_w: int

    @classmethod
    def open(cls, stdin: str) -> ChildPipes:
        stdin_r, stdin_w = os.pipe()
        # The server caps stdin at 64 KiB, the default pipe capacity; non-blocking so that a
        # larger input is cut at the capacity instead of hanging the worker.
        os.set_blocking(stdin_w, False)
        try:
            os.write(stdin_w, stdin.encode())
        except BlockingIOError:
            pass
        finally:
            os.close(stdin_w)
        return cls(stdin_r, *os.pipe(), *os.pipe(), *os.pipe())

    def close_child_ends(self) -> None:
        for fd in (self.stdin_r, self.stdout_w, self.stderr_w, self.status_w):
            os.close(fd)

    def close_parent_ends(self) -> None:
        for fd in (self.stdout_r, self.stderr_r, self.status_r):
            os.close(fd)


@dataclass
class ChildRun:
    """Raw facts about a finished child, before classification."""

    wait_status: int
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    report: bytearray = field(default_factory=bytearray)
    timed_out: bool = False
    over_output: bool = False


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


def _kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except ProcessLookupError:
            pass


def kill_and_reap(pid: int) -> None:
    _kill_group(pid)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def watch(pid: int, pipes: ChildPipes, deadline: float, output_cap: int) -> ChildRun:
    """Supervise the child until it exits or is killed; always reaps it."""
    pidfd = os.pidfd_open(pid)
    buffers = {pipes.stdout_r: bytearray(), pipes.stderr_r: bytearray(), pipes.status_r: bytearray()}
    poller = select.poll()
    for fd in (*buffers, pidfd):
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    timed_out = over_output = exited = False
    try:
        while not exited:
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0:
                timed_out = True
                break
            for fd, _ in poller.poll(max(1, int(remaining_ms) + 1)):
                if fd == pidfd:
                    exited = True
                elif not _drain(fd, buffers[fd], output_cap):
                    poller.unregister(fd)
            if len(buffers[pipes.stdout_r]) > output_cap or len(buffers[pipes.stderr_r]) > output_cap:
                over_output = True
                break
        if not exited:
            _kill_group(pid)
        _, wait_status = os.waitpid(pid, 0)
        for fd, buffer in buffers.items():  # the writers are gone: read what is left, up to EOF
            while len(buffer) <= output_cap and select.select([fd], [], [], 0)[0] and _drain(fd, buffer, output_cap):
                pass
        over_output = over_output or max(len(buffers[pipes.stdout_r]), len(buffers[pipes.stderr_r])) > output_cap
    finally:
        os.close(pidfd)
        pipes.close_parent_ends()
    return ChildRun(wait_status, buffers[pipes.stdout_r], buffers[pipes.stderr_r], buffers[pipes.status_r],
                    timed_out, over_output)


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
    if sig == signal.SIGXCPU:
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


def _safe_relative(root: str, name: str) -> str:
    path = os.path.normpath(os.path.join(root, name))
    if "\0" in name or os.path.isabs(name) or not path.startswith(root.rstrip("/") + "/"):
        raise ValueError(f"file name {name!r} must be a relative path inside the working directory")
    return path


def write_input_files(root: str, files: dict[str, str], uid: int | None) -> None:
    for name, content in files.items():
        path = _safe_relative(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(content or ""))
        if uid is not None:
            os.chown(path, uid, uid)


def read_output_files(root: str, names: tuple[str, ...]) -> dict[str, str]:
    """Fetch files the snippet wrote. No symlinks followed, regular files only, 1 MiB each."""
    fetched: dict[str, str] = {}
    for name in names:
        try:
            path = _safe_relative(root, name)
            if os.path.realpath(path) != path:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (ValueError, OSError):
            continue
        try:
            info = os.fstat(fd)
            if os.path.stat.S_ISREG(info.st_mode) and info.st_size <= _MAX_FETCH_BYTES:
                fetched[name] = base64.b64encode(os.read(fd, _MAX_FETCH_BYTES)).decode()
        finally:
            os.close(fd)
    return fetched


def empty_directory(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)
