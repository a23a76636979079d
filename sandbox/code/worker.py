"""A pre-warmed worker: imports the scientific stack once, jails itself, serves requests.

Started by the server as `python -m sandbox.code.worker SETTINGS_JSON` with the channel
socket on a passed descriptor. Start-up, in order: die with the server, import and
exercise the allowed packages (lazy submodules included, so snippets rarely touch the
disk), compile the seccomp filter, freeze the heap for the garbage collector (so children
don't copy pages just by collecting), enter the jail (root only), fork the zygote
(`sandbox.code.zygote`, pid 1 of the worker's own PID namespace) before touching any
request, say "ready".

Per request: compile and policy-check without forking; write input files into the private
/tmp; put the job in a memfd and have the zygote fork a child for it; watch the child's
stdout/stderr/report pipes and its pidfd with poll until it exits, overflows its output cap
or hits the wall-clock deadline (then SIGKILL it); classify; wipe /tmp. One request at a
time per worker. After each request the worker checks that it can still serve (no
descriptor left open, a pristine /tmp, bounded memory, a live zygote, every child reaped);
if not, its answer says `retire` with the reason and it exits, and the server replaces it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import sys
import time
from dataclasses import dataclass

from sandbox.code import cgroup, files, jail, messages, policy, seccomp, supervise
from sandbox.code.seccomp import SeccompMode
from sandbox.code.child import ChildJob
from sandbox.code.zygote import ChildNotReaped, Zygote, ZygoteLost, ZygoteSetup, start_zygote


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
    seccomp: SeccompMode = "allow-list"
    cgroup_dir: str = ""  # the slot's cgroup v2 (made by the server) where one is delegated


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


class WorkerRetired(Exception):
    """The worker can no longer serve cleanly; the reason goes to the server, which replaces it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


_MAX_RSS_GROWTH_BYTES = 1 << 30  # the worker's own memory (answers, files) must not creep past this


class Worker:
    def __init__(self, settings: WorkerSettings, zygote: Zygote, status_fd: int, memory_max_fd: int = -1) -> None:
        self.settings = settings
        self._memory_max_fd = memory_max_fd  # the slot cgroup's memory.max, opened before the jail
        self.zygote = zygote
        self._status_fd = status_fd  # the worker's own /proc status, opened before the jail hid /proc
        self.workdir = jail.JAIL_TMP if settings.isolated else settings.degraded_tmp
        # Degraded but still root (e.g. a container without CAP_SYS_ADMIN): still drop the uid.
        self.snippet_uid = settings.uid if settings.isolated or os.geteuid() == 0 else None
        self._pristine_tmp = jail.tmp_state() if settings.isolated else None
        self._free_fd = _lowest_free_fd()
        self._baseline_rss = self._rss_bytes()
        self.retired: str | None = None

    def _rss_bytes(self) -> int:
        for line in os.pread(self._status_fd, 8192, 0).decode().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def handle(self, job: messages.Job) -> messages.Outcome:
        started = time.perf_counter()
        prepared = policy.prepare(job.code)
        if isinstance(prepared, policy.Refused):
            return messages.Outcome(prepared.status, "", prepared.stderr, prepared.error,
                                    (time.perf_counter() - started) * 1000, return_code=1)
        try:
            try:
                files.write_input_files(self.workdir, job.files, self.snippet_uid)
                run = self._run_child(job, prepared.code)
                fetched = files.read_output_files(self.workdir, job.fetch_files)
            finally:
                self._wipe_tmp()
        except (ValueError, OSError) as exc:  # bad file names or contents from the request
            return messages.Outcome("error", "", "", f"SandboxError: {exc}", (time.perf_counter() - started) * 1000)
        duration_ms = (time.perf_counter() - started) * 1000
        return supervise.classify(run, job, duration_ms, fetched, self.settings.output_limit_bytes)

    def _run_child(self, job: messages.Job, code) -> supervise.ChildRun:
        # Everything opened here is closed on every path out (the ExitStack), errors included.
        with contextlib.ExitStack() as opened:
            job_fd = os.memfd_create("job", os.MFD_CLOEXEC)
            opened.callback(os.close, job_fd)
            os.write(job_fd, ChildJob(code, job.code, job.timeout_s, job.memory_mb, job.seed).dumps())
            if self._memory_max_fd >= 0:  # every page the child charges, memfd and tmpfs included
                cgroup.set_memory_max(self._memory_max_fd, job.memory_mb)
            pipes = supervise.ChildPipes.open(job.stdin.encode("utf-8", "surrogatepass"))
            opened.callback(pipes.close)
            try:
                pidfd = self.zygote.spawn([job_fd, *pipes.child_ends()])
            except ZygoteLost as exc:
                raise WorkerRetired("zygote", str(exc)) from exc
            opened.callback(os.close, pidfd)
            pipes.close_child_ends()
            run = supervise.watch(pidfd, pipes, time.monotonic() + job.timeout_s, self.settings.output_limit_bytes)
            if not run.exited:
                raise WorkerRetired("unreaped", "a killed snippet did not exit")
            try:
                run.wait_status = self.zygote.wait_status()
            except ChildNotReaped as exc:
                raise WorkerRetired("unreaped", str(exc)) from exc
            except ZygoteLost as exc:
                raise WorkerRetired("zygote", str(exc)) from exc
            return run

    def _wipe_tmp(self) -> None:
        if not self.settings.isolated:
            os.chmod(self.workdir, 0o700)  # degraded: the snippet may own the directory and have changed it
            supervise.empty_directory(self.workdir)
            return
        # Skipping the remount is safe only if nothing at all changed: counts of free inodes and
        # blocks and the directory's times (no names are exempt; see jail.TmpState).
        if jail.tmp_state() != self._pristine_tmp:
            self._pristine_tmp = jail.wipe_tmp(self.settings.tmp_size_mib)

    def check_can_serve(self) -> None:
        """Raise WorkerRetired if this worker must not take another request."""
        if _lowest_free_fd() != self._free_fd:
            raise WorkerRetired("descriptors", "a request left a descriptor open")
        try:
            restored = not self.settings.isolated or jail.tmp_state() == self._pristine_tmp
        except OSError:  # /tmp unmounted and not mounted again
            restored = False
        if not restored:
            raise WorkerRetired("tmp", "the private /tmp could not be restored")
        if self._rss_bytes() > self._baseline_rss + _MAX_RSS_GROWTH_BYTES:
            raise WorkerRetired("memory", "the worker's memory grew past its bound")


def _lowest_free_fd() -> int:
    fd = os.dup(0)
    os.close(fd)
    return fd


def _ready_message(settings: WorkerSettings, zygote: Zygote) -> dict:
    return {"ready": True, "pid": os.getpid(), "slot": settings.slot, "isolated": settings.isolated,
            "zygote_pid": zygote.pid}


def _answer(worker: Worker, message: dict) -> bytes:
    """One request's reply. A function of its own, so nothing of it outlives the reply."""
    retire = None
    try:
        message["fetch_files"] = tuple(message.get("fetch_files", ()))
        outcome = worker.handle(messages.Job(**message))
    except WorkerRetired as exc:
        retire, outcome = exc.reason, _failure(f"SandboxError: the worker running this snippet had to stop ({exc})")
    except Exception as exc:  # noqa: BLE001 - one bad request must not take the worker down
        outcome = _failure(f"SandboxError: {type(exc).__name__}: {exc}")
    if retire is None:
        try:
            worker.check_can_serve()
        except WorkerRetired as exc:
            retire = exc.reason
    reply = dict(outcome.__dict__)
    if retire is not None:
        worker.retired = reply["retire"] = retire
    return messages.encode(reply)


def _failure(error: str) -> messages.Outcome:
    return messages.Outcome("error", "", "", error, 0.0)


def serve(worker: Worker, channel: socket.socket) -> None:
    while worker.retired is None and (message := messages.recv_blocking(channel)) is not None:
        channel.sendall(_answer(worker, message))


def _start(settings: WorkerSettings, channel: socket.socket) -> Worker:
    jail.die_with_parent()
    jail.prepare_worker_process()
    warm_imports()
    os.environ.pop("PYTHONPATH", None)  # only needed to find this package; snippets need no repo path
    program = seccomp.build_filter(census=settings.seccomp == "census")
    status_fd = os.open("/proc/self/status", os.O_RDONLY)
    gc.collect()
    gc.freeze()  # the collector must not touch (and so copy) the warm heap in every child
    prefer_huge_pages()  # reads /proc, so before the jail hides it
    proc_dir_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    memory_max_fd = procs_fd = -1
    if settings.cgroup_dir:  # opened now: the jail shows no /sys
        memory_max_fd = os.open(os.path.join(settings.cgroup_dir, "memory.max"), os.O_WRONLY | os.O_CLOEXEC)
        procs_fd = os.open(os.path.join(settings.cgroup_dir, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    try:
        if settings.isolated:
            jail.enter_worker_jail(jail.JailLayout(settings.python_paths, settings.tmp_size_mib))
            jail.unshare_pid_namespace()  # the zygote becomes pid 1 of the worker's PID namespace
        workdir = jail.JAIL_TMP if settings.isolated else settings.degraded_tmp
        uid = settings.uid if settings.isolated or os.geteuid() == 0 else None
        setup = ZygoteSetup(program, uid, workdir, settings.tmp_size_mib, pid_namespaces=settings.isolated,
                            cgroup_procs_fd=procs_fd)
        worker_only = (channel.fileno(), status_fd) + ((memory_max_fd,) if memory_max_fd >= 0 else ())
        zygote = start_zygote(setup, proc_dir_fd, worker_only, ZYGOTE_ANSWER_TIMEOUT_S)
    finally:
        os.close(proc_dir_fd)
        if procs_fd >= 0:
            os.close(procs_fd)  # the zygote keeps its copy for its children; the worker needs none
    return Worker(settings, zygote, status_fd, memory_max_fd)


ZYGOTE_ANSWER_TIMEOUT_S = supervise.REAP_TIMEOUT_S  # per zygote answer; within the server's grace


def main(argv: list[str]) -> int:
    raw = json.loads(argv[0])
    settings = WorkerSettings(**{**raw, "python_paths": tuple(raw["python_paths"])})
    channel = socket.socket(fileno=settings.channel_fd)
    try:
        worker = _start(settings, channel)
    except Exception as exc:  # noqa: BLE001 - reported to the server, which refuses to start
        channel.sendall(messages.encode({"ready": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    channel.sendall(messages.encode(_ready_message(settings, worker.zygote)))
    serve(worker, channel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
