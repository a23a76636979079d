"""The zygote: the clean process every snippet is forked from. It never sees a request.

A worker that forked its snippets itself would hand each one a copy of its own heap: the
frames, objects and freed buffers of every earlier request it parsed and answered (a
snippet that walked `tb_frame.f_back` read the previous request's output that way). So the
worker forks, once, right after warming up and entering its jail and before its first
request, a zygote whose memory holds only the warm interpreter. Per request:

    worker --(5 descriptors, no data)--> zygote: fork; pidfd of the child --> worker
    child: reads its own job from the job descriptor, locks down, runs
    zygote: waits for the child; its wait status (raw bytes) --> worker

The zygote receives descriptor numbers and a one-byte command, never code, input or
output; the child's wait status goes through a preallocated C buffer that is zeroed again
before the next fork, so no other request's exit code is left in the zygote's memory
either. Every child is pid 1 of a PID namespace of its own (below the zygote's), so it
sees no other process, its pid says nothing about earlier requests, and when it dies the
kernel kills whatever it left. The zygote is pid 1 of the worker's PID namespace: when it
dies, for whatever reason, the kernel kills every snippet of that worker.

The zygote writes as little as it can between forks: a page it writes is one the next child
no longer shares cheaply. So the random generators a child would inherit unchanged are
reseeded by the child itself (`sandbox.code.child`), not here.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
from dataclasses import dataclass

from sandbox.code import jail

SPAWN = b"s"
CHILD_FDS = 5  # job, stdin, stdout, stderr, report
_STATUS_BYTES = ctypes.sizeof(ctypes.c_int)
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ZygoteSetup:
    """What every child needs besides its job; fixed for the worker's life."""

    seccomp_program: ctypes.Structure
    uid: int | None
    workdir: str
    tmp_size_mib: int
    pid_namespaces: bool  # False in degraded mode (no privilege to create them)
    cgroup_procs_fd: int = -1  # the slot cgroup's cgroup.procs, where a delegated cgroup exists


class ZygoteLost(RuntimeError):
    """The zygote died or stopped answering: the worker cannot start clean children any more."""


class ChildNotReaped(ZygoteLost):
    """The child exited (or was killed) but the zygote did not report reaping it in time."""


class Zygote:
    """The worker's handle on its zygote."""

    def __init__(self, sock: socket.socket, pid: int, answer_timeout_s: float) -> None:
        self.sock, self.pid = sock, pid
        sock.settimeout(answer_timeout_s)

    def spawn(self, fds: list[int]) -> int:
        """Start a child holding `fds` (job, stdin, stdout, stderr, report); returns its pidfd."""
        try:
            socket.send_fds(self.sock, [SPAWN], fds)
            message, received, _, _ = socket.recv_fds(self.sock, 1, 1)
        except OSError as exc:
            raise ZygoteLost(f"zygote did not start the child: {exc!r}") from exc
        if message != b"p" or len(received) != 1:
            for fd in received:
                os.close(fd)
            raise ZygoteLost(f"zygote could not fork ({message!r})")
        return received[0]

    def wait_status(self) -> int:
        """The wait status of the last child (sent once the zygote has reaped it)."""
        try:
            data = self.sock.recv(_STATUS_BYTES, socket.MSG_WAITALL)
        except TimeoutError as exc:
            raise ChildNotReaped("the zygote did not reap the child in time") from exc
        except OSError as exc:
            raise ZygoteLost(f"zygote did not reap the child: {exc!r}") from exc
        if len(data) != _STATUS_BYTES:
            raise ZygoteLost("zygote closed its socket")
        return int.from_bytes(data, sys.byteorder, signed=True)


def start_zygote(setup: ZygoteSetup, proc_dir_fd: int, close_in_zygote: tuple[int, ...],
                 answer_timeout_s: float) -> Zygote:
    """Fork the zygote. `proc_dir_fd` (the host's /proc, opened before the jail hid it) lets it
    open its own status file once, for the children's memory baseline."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            jail.die_with_parent()  # root for life, so the kernel never clears it
            ours.close()
            for fd in close_in_zygote:
                os.close(fd)
            status_fd = os.open("self/status", os.O_RDONLY, dir_fd=proc_dir_fd)
            os.close(proc_dir_fd)
            own_pidfd = os.pidfd_open(os.getpid()) if setup.pid_namespaces else -1
            _serve(theirs, setup, status_fd, own_pidfd)
        finally:
            os._exit(0)
    theirs.close()
    return Zygote(ours, pid, answer_timeout_s)


def _serve(sock: socket.socket, setup: ZygoteSetup, status_fd: int, own_pidfd: int) -> None:
    status = ctypes.c_int(0)
    while _spawn_one(sock, setup, status_fd, own_pidfd, status):
        pass


def _spawn_one(sock: socket.socket, setup: ZygoteSetup, status_fd: int, own_pidfd: int, status: ctypes.c_int) -> bool:
    try:
        message, fds, _, _ = socket.recv_fds(sock, 1, CHILD_FDS)
    except OSError:
        return False
    if message != SPAWN or len(fds) != CHILD_FDS:
        for fd in fds:
            os.close(fd)
        return bool(message)  # empty = the worker is gone
    try:
        if setup.pid_namespaces:
            jail.new_pid_namespace_for_children(own_pidfd)
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        del exc
        sock.send(b"f")  # the worker reports the failure and retires
        return True
    if pid == 0:
        from sandbox.code.child import child_main

        child_main(setup, fds, status_fd)  # never returns
        os._exit(70)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        socket.send_fds(sock, [b"p"], [pidfd])
    finally:
        os.close(pidfd)
    while _libc.waitpid(pid, ctypes.byref(status), 0) < 0 and ctypes.get_errno() == 4:  # EINTR
        pass
    try:
        sock.send(status)  # the raw C int: no Python object ever holds a child's exit status
    finally:
        status.value = 0
    return True

