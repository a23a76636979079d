"""Symbolic equivalence (math-verify / sympy) under a hard time limit, from any thread.

math-verify's own time limit uses SIGALRM, which works only in the main thread, and a
running sympy call cannot be interrupted from inside its process. So every check runs in
a worker process (`symbolic_worker.py`): the caller writes (prediction, gold) to its stdin
and waits for the verdict line; a worker that runs over the limit is killed and replaced, and
the check counts as "not equivalent". Callers in any thread or event loop get a bounded wait.

The limit is the *worker's CPU time* for the check, not the caller's wall clock: a verdict is a
reward, and a reward must not depend on how busy the machine is (on a loaded or memory-starved
machine a check that needs 0.3 s of CPU can take seconds of wall time, and a wall-clock limit then
turned a correct answer into a wrong one in one run and not in its repeat). CPU time still varies
a little with the machine's state (caches), so a check within a few percent of the limit may
still go either way. A worker that spends no CPU (stopped, starved of memory) is given up after
`wall_factor` times the limit in wall time, counted apart in `stalls`.

Workers start lazily on first use (about a second each) and are killed at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

WORKER_SCRIPT = Path(__file__).with_name("symbolic_worker.py")
_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take seconds
MAX_INPUT_CHARS = 2000  # longer "answers" are not answers; never feed them to sympy
POLL_S = 0.02  # how often a waiting caller reads the worker's CPU time (a verdict wakes it at once)
WALL_FACTOR = 30.0  # wall-clock backstop, in multiples of the CPU-time limit


class _Worker:
    """One worker process and a line reader over its stdout with a deadline."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._ps = psutil.Process(self._process.pid)
        self._buffer = b""
        self.gave_up: str | None = None  # which limit the last wait ran over: "cpu" or "wall"
        if self._read_line(_STARTUP_TIMEOUT_S) != "ready":
            self.kill()
            raise RuntimeError(f"symbolic checker worker ({WORKER_SCRIPT.name}) did not start")

    def _read_line(self, timeout_s: float, cpu_limit_s: float | None = None) -> str | None:
        """The next stdout line, or None when none arrives within `timeout_s` of wall time or, with
        `cpu_limit_s`, before the worker has spent that much CPU time from now."""
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        cpu_start = self.cpu_seconds() if cpu_limit_s is not None else 0.0
        self.gave_up = None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.gave_up = "wall"
                return None
            if not select.select([fd], [], [], left if cpu_limit_s is None else min(left, POLL_S))[0]:
                if cpu_limit_s is not None and self.cpu_seconds() - cpu_start > cpu_limit_s:
                    self.gave_up = "cpu"
                    return None
                continue
            chunk = os.read(fd, 4096)
            if not chunk:  # the worker died (e.g. killed by the memory limit)
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def cpu_seconds(self) -> float:
        """The worker's CPU time so far (user and system); infinite once it is gone."""
        try:
            times = self._ps.cpu_times()
        except psutil.Error:
            return float("inf")
        return times.user + times.system

    def check(self, pred: str, gold: str, cpu_limit_s: float, wall_limit_s: float) -> bool | None:
        """The verdict, or None when the worker ran over a limit (`gave_up` says which) or died."""
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps([pred, gold]).encode() + b"\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            return None
        line = self._read_line(wall_limit_s, cpu_limit_s)
        return None if line is None else line == "1"

    def kill(self) -> None:
        self._process.kill()
        self._process.wait(timeout=10)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()


class SymbolicChecker:
    """A small pool of killable math-verify workers; `equivalent` is safe from any thread."""

    def __init__(self, timeout_s: float, workers: int = 1, wall_factor: float = WALL_FACTOR) -> None:
        self.timeout_s = timeout_s  # of the worker's CPU time (see the module)
        self.wall_limit_s = timeout_s * wall_factor
        self.timeouts = 0  # checks that hit a limit (or crashed the worker), for logging
        self.stalls = 0  # of those, the ones given up in wall time while the worker spent too little CPU
        self._size = workers
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._started = 0
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    def start(self) -> None:
        """Start every worker now (in parallel), so the first checks do not pay for it."""
        with self._lock:
            missing = self._size - self._started
            self._started += missing
        workers: list[_Worker] = []
        errors: list[Exception] = []

        def spawn() -> None:
            try:
                workers.append(_Worker())
            except Exception as error:  # noqa: BLE001 - re-raised below, after the others
                errors.append(error)

        threads = [threading.Thread(target=spawn) for _ in range(missing)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with self._lock:
            self._started -= len(errors)
        for worker in workers:
            self._release(worker)
        if errors:
            raise errors[0]

    def equivalent(self, pred: str, gold: str) -> bool:
        """True when math-verify proves pred == gold within the time limit."""
        if len(pred) > MAX_INPUT_CHARS or len(gold) > MAX_INPUT_CHARS:
            return False
        worker = self._acquire()
        verdict = worker.check(pred, gold, self.timeout_s, self.wall_limit_s)
        if verdict is None:
            worker.kill()
            with self._lock:
                self.timeouts += 1
                self.stalls += worker.gave_up == "wall"
                self._started -= 1
            return False
        self._release(worker)
        return verdict

    def _acquire(self) -> _Worker:
        """An idle worker, a new one while the pool is below size, or wait for one."""
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                if self._closed:
                    raise RuntimeError("symbolic checker is closed")
                grow = self._started < self._size
                if grow:
                    self._started += 1
            if grow:
                try:
                    return _Worker()
                except Exception:
                    with self._lock:
                        self._started -= 1
                    raise
            try:
                # Wake up now and then: a worker killed on time-out frees a slot, not the queue.
                return self._idle.get(timeout=0.05)
            except queue.Empty:
                continue

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            closed = self._closed
        if closed:
            worker.kill()
        else:
            self._idle.put(worker)

    def close(self) -> None:
        """Kill the idle workers now; busy ones are killed as they are released."""
        with self._lock:
            self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return
