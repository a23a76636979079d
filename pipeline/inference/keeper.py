"""The thread that keeps one server up: start with a deadline, watch, restart a bounded number of times, catch up.

One thread per server, living exactly as long as the server should (the parent-death signal of a process is tied to
the thread that started it: pipeline.inference.server). A server started elsewhere (a URL) has a keeper too, without
a process: it cannot restart it, only notice that it stopped answering and bring it back to the current weights once
it answers again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pipeline.inference.control import healthy
from pipeline.inference.server import Log, Server, ServerProcess, ServerState


class Keeper(threading.Thread):
    """Keeps `server` (started as `process`, or external when None) up until `stop()`."""

    def __init__(self, server: Server, process: ServerProcess | None, *, catch_up: Callable[[Server], None], log: Log,
                 start_timeout_s: float, max_restarts: int, interval_s: float, unhealthy_polls: int) -> None:
        super().__init__(name=f"keeper-{server.name}", daemon=True)
        self.server, self.process, self.catch_up, self.log = server, process, catch_up, log
        self.start_timeout_s, self.max_restarts = start_timeout_s, max_restarts
        self.interval_s, self.unhealthy_polls = interval_s, unhealthy_polls
        self.stopping = threading.Event()

    def stop(self, timeout_s: float = 60.0) -> None:
        """End the keeper; it stops its server's process group before it ends."""
        self.stopping.set()
        if self.is_alive():
            self.join(timeout_s)

    def run(self) -> None:
        try:
            while self._bring_up():
                why = self._watch()
                if why is None or not self._may_restart(why):
                    return
        finally:
            if self.process is not None:
                self.process.stop()

    def _bring_up(self) -> bool:
        """Start (or wait for) the server and catch it up; False when given up on or stopping."""
        server = self.server
        while not self.stopping.is_set():
            server.state = ServerState.STARTING
            try:
                self._start()
                server.state = ServerState.CATCHING_UP
                self.catch_up(server)
            except Exception as err:  # noqa: BLE001 - any failure to come up is a failed start, retried within bounds
                if self.stopping.is_set():
                    return False
                if self.process is not None:
                    self.process.stop()
                if not self._may_restart(f"did not come up ({type(err).__name__}: {err})"):
                    return False
                continue
            server.dead.clear()
            server.check.clear()
            server.generation += 1
            if server.state is ServerState.CATCHING_UP:
                server.state = ServerState.READY
            return True
        return False

    def _start(self) -> None:
        if self.process is not None:
            self.process.start(self.start_timeout_s, any_thread=True, cancel=self.stopping)
            return
        while not healthy(self.server.url):  # an external server: wait for it (the pool's start has the deadline)
            if self.stopping.wait(self.interval_s):
                raise RuntimeError("stopping")

    def _watch(self) -> str | None:
        """Wait until the server dies (why) or the keeper stops (None)."""
        server, misses = self.server, 0
        while not self.stopping.is_set():
            self._pause()
            if self.stopping.is_set():
                return None
            if server.dead.is_set():
                return f"marked dead ({server.last_error})"
            if self.process is not None and self.process.process is not None and self.process.process.poll() is not None:
                return f"exited with code {self.process.process.returncode}"
            checked = server.check.is_set()
            if healthy(server.url):
                misses = 0
                server.check.clear()  # verified: a request may be sent to it again
                continue
            misses += 1
            if checked or misses >= self.unhealthy_polls:
                why = "a request to it broke and" if checked else f"{misses} health checks in a row:"
                return f"{why} it does not answer its health check ({server.last_error})"
        return None

    def _pause(self) -> None:
        """Sleep one interval, or less when the server is marked dead or suspect."""
        end = time.monotonic() + self.interval_s
        while time.monotonic() < end and not (self.server.dead.is_set() or self.server.check.is_set()):
            if self.stopping.wait(min(0.1, self.interval_s)):
                return

    def _may_restart(self, why: str) -> bool:
        server = self.server
        server.state = ServerState.STARTING
        server.last_error = why
        tail = f" Log tail:\n{self.process.log_tail(10)}" if self.process is not None else ""
        if self.process is None:  # nothing to restart: wait for it to answer again
            self.log(f"warning: inference server {server.name} at {server.url} {why}; waiting for it to answer again")
            return True
        if server.restarts >= self.max_restarts:
            server.state = ServerState.FAILED
            self.log(f"error: inference server {server.name} at {server.url} {why}; not restarted again after "
                     f"{self.max_restarts} restart(s).{tail}")
            return False
        server.restarts += 1
        self.process.stop()
        self.log(f"warning: inference server {server.name} at {server.url} {why}; restarting it "
                 f"({server.restarts} of {self.max_restarts}).{tail}")
        return True
