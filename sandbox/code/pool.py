"""The server's pool of pre-warmed workers: bounded queue, dispatch, replacement, statistics.

Each worker is a separate `python -m sandbox.code.worker` process (never a fork of the
server, which runs an event loop and may hold threads) started with a scrubbed environment,
so no server variable (API keys, service URLs) ever reaches a snippet. A request waits for
an idle worker; when `queue_size` requests already wait, it is refused at once (HTTP 429).
A worker that stops answering (killed, crashed, or past its deadline plus a grace period)
is killed and replaced in the background, and the request gets an error outcome; so is one
that says, with its answer, that it can no longer serve cleanly (a descriptor left open, a
/tmp it could not restore, too much memory, a lost zygote, a child it could not reap).
Replacements are counted by reason in `/health`.

Killing a worker kills its zygote (parent-death signal), and the zygote is pid 1 of the
worker's PID namespace, so the kernel then kills every snippet of that worker. The pool
waits (through a pidfd on the zygote) until that namespace is gone before it starts the
slot's replacement, which reuses the slot's uid; a zygote that does not go within
`supervise.REAP_TIMEOUT_S` is counted in `/health` as `unreaped`.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import select
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandbox.code import messages
from sandbox.code.cgroup import Delegation, SlotCgroups
from sandbox.code.seccomp import SeccompMode
from sandbox.code.supervise import REAP_TIMEOUT_S

log = logging.getLogger("sandbox.code")
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
# Beyond the snippet's own limit, a worker may take up to two REAP_TIMEOUT_S waits (the kill,
# the zygote's report) before it answers; past this the server gives up on it.
_ANSWER_GRACE_S = 15.0


class PoolFull(Exception):
    """Too many requests are already waiting."""


class WorkerStartError(RuntimeError):
    """A worker could not start (for instance, it could not build its jail)."""


@dataclass(frozen=True)
class PoolSettings:
    workers: int
    queue_size: int
    isolated: bool
    uid_base: int
    tmp_size_mib: int
    output_limit_bytes: int
    start_timeout_s: float = 120.0
    seccomp: SeccompMode = "allow-list"  # "census": allow every call (only for measuring, see syscall_census)
    cgroup: Delegation | None = None  # a cgroup v2 delegated to the service (see sandbox.code.cgroup)
    cgroup_reason: str = "not probed"  # why that cgroup, or why none
    tasks_per_snippet: int = 32  # the slot cgroup's pids.max (RLIMIT_NPROC bounds the same)


def worker_environment() -> dict[str, str]:
    """The whole environment a worker (and so every snippet) sees: nothing from the server's."""
    return {
        "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "PYTHONPATH": _REPO_ROOT,
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "0",
        # One BLAS thread: the worker must stay single-threaded to fork safely, and 2 cores
        # shared by many snippets gain nothing from more.
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",  # each arena reserves 64 MiB of address space against RLIMIT_AS
        # One string-hash key for every worker of every start: a set of strings prints in the same order in every
        # run (a random key per worker made a snippet's output depend on which worker, in which start, ran it).
        # Every snippet of a worker shares its key anyway; a known key only lets a snippet slow its own dicts.
        "PYTHONHASHSEED": "0",
    }


def jail_python_paths() -> tuple[str, ...]:
    """Directories the jail must show read-only so lazily imported modules still load: each both where it really
    is and as the interpreter spells it in `sys.path`, which keeps a symlink on the way (a virtualenv or a home
    directory reached through a link); the jail holds no symlinks of the host, so a path shown only resolved
    would fail every import not made before the jail was entered."""
    spelled = [sys.base_prefix, *site.getsitepackages()]
    paths = {q for p in spelled for q in (os.path.abspath(p), os.path.realpath(p))}
    return tuple(sorted(p for p in paths if os.path.isdir(p)))


class _WorkerProcess:
    def __init__(self, slot: int, process: subprocess.Popen, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, scratch: str) -> None:
        self.slot, self.process, self.reader, self.writer, self.scratch = slot, process, reader, writer, scratch
        self.zygote_pidfd = -1

    def watch_zygote(self, pid: int) -> None:
        """Hold a pidfd on the zygote (a child of our worker, so its pid cannot be reused yet)."""
        self.zygote_pid, self.zygote_pidfd = pid, os.pidfd_open(pid)

    async def request(self, job: messages.Job) -> tuple[messages.Outcome, str | None]:
        self.writer.write(messages.encode(messages.job_message(job)))
        await self.writer.drain()
        return messages.outcome_from_message(await messages.recv_async(self.reader))

    def kill(self) -> bool:
        """Kill the worker and its zygote; True once every snippet of theirs is gone."""
        self.writer.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        gone = True
        if self.zygote_pidfd >= 0:
            try:  # it dies with the worker anyway (parent-death signal); this only makes it sooner
                signal.pidfd_send_signal(self.zygote_pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # Readable once the zygote has exited, which as pid 1 of the namespace is after the
            # kernel has killed and reaped everything else in it.
            gone = bool(select.select([self.zygote_pidfd], [], [], REAP_TIMEOUT_S)[0])
            os.close(self.zygote_pidfd)
            self.zygote_pidfd = -1
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return gone


class WorkerPool:
    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self._idle: asyncio.Queue[_WorkerProcess] = asyncio.Queue()
        self._all: dict[int, _WorkerProcess] = {}
        self._waiting = 0
        self._busy = 0
        self._served = 0
        self._restarts = 0
        self._replaced: collections.Counter[str] = collections.Counter()
        self._unreaped = 0
        self._by_status: collections.Counter[str] = collections.Counter()
        self._respawns: set[asyncio.Task] = set()
        self._cgroups = (SlotCgroups(settings.cgroup, settings.workers, settings.tasks_per_snippet)
                         if settings.cgroup else None)

    async def start(self) -> None:
        """Start every worker; raise `WorkerStartError` with the worker's reason if one fails."""
        if self._cgroups:
            try:
                self._cgroups.create()
            except OSError as exc:
                self._cgroups.remove()
                raise WorkerStartError(f"could not set up the delegated cgroup: {exc!r}") from exc
        results = await asyncio.gather(*(self._spawn(slot) for slot in range(self.settings.workers)),
                                       return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for worker in results:
                if isinstance(worker, _WorkerProcess):
                    self._kill(worker)
            raise WorkerStartError(str(failures[0])) from failures[0]
        for worker in results:
            assert isinstance(worker, _WorkerProcess)  # no failures, so every result is a worker
            self._all[worker.slot] = worker
            self._idle.put_nowait(worker)

    async def _spawn(self, slot: int) -> _WorkerProcess:
        parent_end, child_end = socket.socketpair()
        scratch = "" if self.settings.isolated else tempfile.mkdtemp(prefix=f"sandbox-code-{slot}-")
        if scratch:
            os.chmod(scratch, 0o700)
            if os.geteuid() == 0:  # snippets will run as the slot's uid (see Worker.snippet_uid)
                os.chown(scratch, self.settings.uid_base + slot, self.settings.uid_base + slot)
        settings = {
            "slot": slot, "channel_fd": child_end.fileno(), "isolated": self.settings.isolated,
            "uid": self.settings.uid_base + slot, "tmp_size_mib": self.settings.tmp_size_mib,
            "output_limit_bytes": self.settings.output_limit_bytes, "python_paths": list(jail_python_paths()),
            "degraded_tmp": scratch, "seccomp": self.settings.seccomp,
            "cgroup_dir": self._cgroups.slot_dir(slot) if self._cgroups else "",
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "sandbox.code.worker", json.dumps(settings)],
            pass_fds=[child_end.fileno()], env=worker_environment(), cwd="/", stdin=subprocess.DEVNULL,
        )
        child_end.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent_end, limit=messages.MAX_MESSAGE_BYTES)
        worker = _WorkerProcess(slot, process, reader, writer, scratch)
        try:
            hello = await asyncio.wait_for(messages.recv_async(reader), self.settings.start_timeout_s)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            worker.kill()
            raise WorkerStartError(f"worker {slot} did not start: {exc!r} (exit code {process.poll()})") from exc
        if not hello.get("ready"):
            worker.kill()
            raise WorkerStartError(f"worker {slot} could not isolate itself: {hello.get('error')}")
        worker.watch_zygote(hello["zygote_pid"])
        return worker

    async def run(self, job: messages.Job) -> messages.Outcome:
        if self._waiting >= self.settings.queue_size:
            raise PoolFull(f"{self._waiting} requests already waiting")
        self._waiting += 1
        try:
            worker = await self._idle.get()
        finally:
            self._waiting -= 1
        self._busy += 1
        try:
            outcome, retire = await asyncio.wait_for(worker.request(job), job.timeout_s + _ANSWER_GRACE_S)
        except asyncio.CancelledError:
            # Its answer would arrive as the reply to the next request: the worker cannot be reused.
            self._replace(worker, "cancelled")
            raise
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            log.error("worker %d failed (%r); replacing it", worker.slot, exc)
            self._replace(worker, "timeout" if isinstance(exc, asyncio.TimeoutError) else "crashed")
            outcome = messages.Outcome("error", "", "", f"SandboxError: the worker running this snippet failed ({type(exc).__name__})", 0.0)
        else:
            if retire is None:
                self._idle.put_nowait(worker)
            else:
                log.warning("worker %d retired (%s); replacing it", worker.slot, retire)
                self._replace(worker, retire)
        finally:
            self._busy -= 1
        self._served += 1
        self._by_status[outcome.status] += 1
        return outcome

    def _replace(self, worker: _WorkerProcess, reason: str) -> None:
        self._replaced[reason] += 1
        self._unreaped += reason == "unreaped"
        self._all.pop(worker.slot, None)
        self._kill(worker)
        task = asyncio.get_running_loop().create_task(self._respawn(worker.slot))
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    def _kill(self, worker: _WorkerProcess) -> None:
        if not worker.kill():
            self._unreaped += 1
            log.error("worker %d: its zygote did not exit within %.0f s of SIGKILL", worker.slot, REAP_TIMEOUT_S)

    async def _respawn(self, slot: int) -> None:
        delay = 0.5
        while True:
            try:
                fresh = await self._spawn(slot)
            except WorkerStartError as exc:
                log.error("replacement for worker %d failed: %s; retrying in %.1fs", slot, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            self._restarts += 1
            self._all[slot] = fresh
            self._idle.put_nowait(fresh)
            return

    def stats(self) -> dict:
        return {
            "workers": len(self._all), "busy": self._busy, "idle": self._idle.qsize(), "queue": self._waiting,
            "queue_size": self.settings.queue_size, "served": self._served, "restarts": self._restarts,
            "replaced": dict(self._replaced), "unreaped": self._unreaped,
            "by_status": {status: self._by_status.get(status, 0) for status in messages.STATUSES},
            "isolation": "full" if self.settings.isolated else "degraded",
            "pid_namespace": "per-snippet" if self.settings.isolated else "none",
            "memory_limit": self._memory_limit(),
        }

    def _memory_limit(self) -> dict:
        # With a delegated cgroup every page a snippet charges is bounded (memfd stays denied
        # anyway); without one, RLIMIT_AS plus the size-limited /tmp, and memfd (which
        # RLIMIT_AS cannot count) is denied.
        cgroups = self._cgroups
        return {"mode": "cgroup2" if cgroups else "rlimit+memfd-denied", "memfd": "denied",
                "tmp_mib": self.settings.tmp_size_mib, "rlimit_as": True,
                "cgroup": cgroups.delegation.path if cgroups else None, "reason": self.settings.cgroup_reason}

    async def close(self) -> None:
        for task in list(self._respawns):
            task.cancel()
        for worker in list(self._all.values()):
            self._kill(worker)
        self._all.clear()
        if self._cgroups:
            self._cgroups.remove()
