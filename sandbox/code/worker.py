"""A pre-warmed worker: imports the scientific stack once, jails itself, forks per request.

Started by the server as `python -m sandbox.code.worker SETTINGS_JSON` with the channel
socket on a passed descriptor. Start-up, in order: die with the server, import and
exercise the allowed packages (lazy submodules included, so snippets rarely touch the
disk), enter the jail (root only), compile the seccomp filter, freeze the heap for the
garbage collector (so children don't copy pages just by collecting), say "ready".

Per request: compile and policy-check without forking; write input files into the private
/tmp; fork; watch the child's stdout/stderr/report pipes and its pidfd with poll until it
exits, overflows its output cap or hits the wall-clock deadline (then SIGKILL its process
group); classify; wipe /tmp. One request at a time per worker.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import time
from dataclasses import dataclass

from sandbox.code import jail, policy, protocol, seccomp, supervise
from sandbox.code.child import ChildSetup, child_main


@dataclass(frozen=True)
class WorkerSettings:
    slot: int
    channel_fd: int
    isolated: bool  # False = degraded mode (not root): no namespaces, no uid change
    uid: int
    tmp_size_mib: int
    output_limit_bytes: int
    python_paths: tuple[str, ...]
    degraded_tmp: str = ""  # per-worker scratch dir on the host, degraded mode only


def warm_imports() -> None:
    """Import the allowed stack and run a little of it, so lazy imports happen now."""
    for name in sorted(policy.ALLOWED_MODULES - {"scipy"}):
        __import__(name)
    import numpy as np
    import sympy

    x, y = sympy.symbols("x y")
    sympy.factor(x**2 - 1), sympy.solve([x + y - 2, x - y], [x, y]), sympy.integrate(sympy.sin(x) * x, x)
    sympy.simplify(sympy.sin(x) ** 2 + sympy.cos(x) ** 2), sympy.limit(sympy.sin(x) / x, x, 0)
    sympy.series(sympy.exp(x), x, 0, 4), sympy.N(sympy.pi, 30), sympy.Matrix([[1, 2], [3, 4]]).inv()
    sympy.sympify("x**2 + 1"), sympy.latex(x**2), sympy.isprime(97), sympy.nsimplify(0.5), sympy.diff(x**3, x)
    sympy.Poly(x**2 + 1, x).all_roots(), sympy.summation(x, (x, 1, 10)), sympy.binomial(10, 3), sympy.factorint(360)
    rng = np.random.default_rng(0)
    a = rng.random((4, 4))
    np.linalg.solve(a + np.eye(4), np.ones(4)), np.linalg.eig(a), np.fft.fft(np.ones(8)), np.polyfit([0, 1, 2], [1, 2, 5], 2)
    str(a), repr(np.float64(1.5)), np.array2string(a)
    print(end="", flush=True)


_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25


def prefer_huge_pages() -> int:
    """Back the warm heap with 2 MiB pages where possible; returns the bytes advised.

    fork() copies one page-table entry per 4 KiB page and exit() tears them down again, which
    is most of a request's cost; with huge pages it is one entry per 2 MiB. A snippet's first
    write into a huge page splits it and copies only the 4 KiB it touched (Linux >= 5.8), so
    isolation between requests is unchanged. MADV_COLLAPSE (Linux >= 6.1) does it now
    rather than whenever khugepaged gets round to it; on older kernels this is a no-op."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            anonymous = len(fields) < 6 or fields[5] == "[heap]"
            if not (anonymous and fields[1].startswith("rw")):
                continue
            low, high = (int(x, 16) for x in fields[0].split("-"))
            start, end = (low + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1), high & ~(_HUGE_PAGE - 1)
            if end > start and libc.madvise(start, end - start, _MADV_HUGEPAGE) == 0:
                libc.madvise(start, end - start, _MADV_COLLAPSE)
                advised += end - start
    return advised


class Worker:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.program = seccomp.build_filter()
        # Opened before the jail hides /proc: the baseline for the per-request memory budget.
        self._status_fd = os.open("/proc/self/status", os.O_RDONLY)
        self.workdir = jail.JAIL_TMP if settings.isolated else settings.degraded_tmp
        # Degraded but still root (e.g. a container without CAP_SYS_ADMIN): still drop the uid.
        self.snippet_uid = settings.uid if settings.isolated or os.geteuid() == 0 else None

    def _virtual_memory_bytes(self) -> int:
        for line in os.pread(self._status_fd, 8192, 0).decode().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("VmSize missing from /proc/self/status")

    def limits(self, job: protocol.Job) -> jail.ChildLimits:
        return jail.ChildLimits(
            cpu_s=int(job.timeout_s) + 1,
            address_space_bytes=self._virtual_memory_bytes() + job.memory_mb * (1 << 20),
            file_size_bytes=self.settings.tmp_size_mib << 20,
            open_files=64,
            tasks=32,
        )

    def handle(self, job: protocol.Job) -> protocol.Outcome:
        started = time.perf_counter()
        prepared = policy.prepare(job.code)
        if isinstance(prepared, policy.Refused):
            return protocol.Outcome(prepared.status, "", prepared.stderr, prepared.error,
                                    (time.perf_counter() - started) * 1000, return_code=1)
        try:
            supervise.write_input_files(self.workdir, job.files, self._owner_uid())
            run = self._fork_and_watch(job, prepared.code)
            fetched = supervise.read_output_files(self.workdir, job.fetch_files)
        except (ValueError, OSError) as exc:  # bad file names or contents from the request
            return protocol.Outcome("error", "", "", f"SandboxError: {exc}", (time.perf_counter() - started) * 1000)
        finally:
            self._wipe_tmp()
        duration_ms = (time.perf_counter() - started) * 1000
        return supervise.classify(run, job, duration_ms, fetched, self.settings.output_limit_bytes)

    @staticmethod
    def reseed_for_next_child() -> None:
        """Fresh entropy for numpy's global generator, inherited by the next child only.

        Every child is a copy of this worker, so without it all requests would draw the same
        "random" numbers. Done here, between requests, because seeding inside the child costs
        ~1.5 ms of copied pages per request. (`random` reseeds itself in each child: CPython
        registers that as an at-fork hook.)"""
        import numpy

        numpy.random.seed(numpy.frombuffer(os.urandom(16), dtype=numpy.uint32))

    def _owner_uid(self) -> int | None:
        return self.snippet_uid

    def _fork_and_watch(self, job: protocol.Job, code) -> supervise.ChildRun:
        pipes = supervise.ChildPipes.open(job.stdin)
        setup = ChildSetup(code, job.code, pipes.stdin_r, pipes.stdout_w, pipes.stderr_w, pipes.status_w,
                           self.limits(job), self._owner_uid(), self.program, self.workdir)
        pid = os.fork()
        if pid == 0:
            child_main(setup)  # never returns; the exit below is a second fence
            os._exit(70)
        pipes.close_child_ends()
        try:
            return supervise.watch(pid, pipes, time.monotonic() + job.timeout_s, self.settings.output_limit_bytes)
        except BaseException:
            supervise.kill_and_reap(pid)  # never leave a snippet running behind a failed watch
            raise

    def _wipe_tmp(self) -> None:
        if not self.settings.isolated:
            os.chmod(self.workdir, 0o700)  # degraded: the snippet may own the directory and have changed it
        # An empty /tmp is already clean: the snippet's uid cannot change the root-owned,
        # sticky directory itself, and it has exited. Remounting costs more than the check.
        ours = jail.python_tmp_entries() if self.settings.isolated else frozenset()
        with os.scandir(self.workdir) as entries:
            if all(entry.name in ours for entry in entries):
                return
        if self.settings.isolated:
            jail.wipe_tmp(self.settings.tmp_size_mib)
        else:
            supervise.empty_directory(self.workdir)


def _ready_message(settings: WorkerSettings) -> dict:
    return {"ready": True, "pid": os.getpid(), "slot": settings.slot, "isolated": settings.isolated}


def serve(worker: Worker, channel: socket.socket) -> None:
    while (message := protocol.recv_blocking(channel)) is not None:
        message["fetch_files"] = tuple(message.get("fetch_files", ()))
        job = protocol.Job(**message)
        try:
            outcome = worker.handle(job)
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the worker down
            outcome = protocol.Outcome("error", "", "", f"SandboxError: {type(exc).__name__}: {exc}", 0.0)
        channel.sendall(protocol.encode(outcome.__dict__))
        worker.reseed_for_next_child()  # after answering: off the request's latency


def main(argv: list[str]) -> int:
    raw = json.loads(argv[0])
    settings = WorkerSettings(**{**raw, "python_paths": tuple(raw["python_paths"])})
    channel = socket.socket(fileno=settings.channel_fd)
    try:
        jail.die_with_parent()
        jail.prepare_worker_process()
        warm_imports()
        os.environ.pop("PYTHONPATH", None)  # only needed to find this package; snippets need no repo path
        worker = Worker(settings)
        gc.collect()
        gc.freeze()  # the collector must not touch (and so copy) the warm heap in every child
        prefer_huge_pages()  # reads /proc, so before the jail hides it
        if settings.isolated:
            jail.enter_worker_jail(jail.JailLayout(settings.python_paths, settings.tmp_size_mib))
    except Exception as exc:  # noqa: BLE001 - reported to the server, which refuses to start
        channel.sendall(protocol.encode({"ready": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    worker.reseed_for_next_child()
    channel.sendall(protocol.encode(_ready_message(settings)))
    serve(worker, channel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
