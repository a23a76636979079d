"""Symbolic equivalence (math-verify / sympy) under a hard time limit, from any thread.

math-verify's own time limit uses SIGALRM, which works only in the main thread, and a
running sympy call cannot be interrupted from inside its process. So every check runs in
a worker process (`symbolic_worker.py`): the caller writes (prediction, gold) to its stdin
and waits at most `timeout_s` for the verdict line; a worker that misses the deadline is
killed and replaced, and the check counts as "not equivalent". Callers in any thread or
event loop therefore get a bounded wait.

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

WORKER_SCRIPT = Path(__file__).with_name("symbolic_worker.py")
_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take seconds
MAX_INPUT_CHARS = 2000  # longer "answers" are not answers; never feed them to sympy


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
        self._buffer = b""
        if self._read_line(_STARTUP_TIMEOUT_S) != "ready":
            self.kill()
            raise RuntimeError(f"symbolic checker worker ({WORKER_SCRIPT.name}) did not start")

    def _read_line(self, timeout_s: float) -> str | None:
        """The next stdout line, or None when none arrives before the deadline."""
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:  # the worker died (e.g. killed by the memory limit)
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def check(self, pred: str, gold: str, timeout_s: float) -> bool | None:
        """The verdict, or None when the worker missed the deadline or died."""
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps([pred, gold]).encode() + b"\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            return None
        line = self._read_line(timeout_s)
        return None if line is None else line == "1"

    def kill(self) -> None:
        self._process.kill()
        self._process.wait(timeout=10)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()


class SymbolicChecker:
    """A small pool of killable math-verify workers; `equivalent` is safe from any thread."""

    def __init__(self, timeout_s: float, workers: int = 1) -> None:
        self.timeout_s = timeout_s
        self.timeouts = 0  # checks that hit the limit (or crashed the worker), for logging
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
        verdict = worker.check(pred, gold, self.timeout_s)
        if verdict is None:
            worker.kill()
            with self._lock:
                self.timeouts += 1
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
