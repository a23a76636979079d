"""Helpers of the fault tests: real processes, real signals, and `ps` (psutil) to prove nothing is left.

Waits are for events (a line printed, a process gone) with generous upper bounds, never fixed sleeps
that a busy machine could outrun.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import psutil
import pytest

from pipeline.paths import REPO_ROOT
from pipeline.services.processes import ServiceProcess, free_port, python_service
from tests.helpers.loopback import serving

EVENT_TIMEOUT_S = 240.0  # an upper bound on waiting for an event on a loaded 2-core machine, not a timing


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = EVENT_TIMEOUT_S, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(poll_s)


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def assert_all_gone(procs: list[psutil.Process], what: str) -> None:
    """Every process in `procs` ends (the stage's watcher may take its grace period); kills and fails otherwise."""
    try:
        wait_for(lambda: not any(alive(p) for p in procs), f"{what} to end")
    except AssertionError:
        left = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in procs if alive(p)]
        for p in procs:
            if alive(p):
                p.kill()
        raise AssertionError(f"{what} left running: {left}") from None


def stage_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_URL": "", **extra}


class Stage:
    """A stage command run as its own process, its output collected line by line."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.log = cwd / f"stage-{len(list(cwd.glob('stage-*.log')))}.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(args, cwd=cwd, env=env or stage_env(), stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_line(self, text: str) -> None:
        wait_for(lambda: text in self.output() or self.proc.poll() is not None, f"{text!r} in the stage's output")
        assert text in self.output(), f"the stage ended (exit {self.proc.returncode}) before {text!r}:\n{self.output()[-3000:]}"

    def wait(self) -> int:
        rc = self.proc.wait(EVENT_TIMEOUT_S)
        self._out.close()
        return rc

    def kill_all(self) -> None:
        for p in ([psutil.Process(self.proc.pid)] if self.proc.poll() is None else []) + self._children():
            if alive(p):
                p.kill()

    def _children(self) -> list[psutil.Process]:
        try:
            return descendants(self.proc.pid)
        except psutil.NoSuchProcess:
            return []


@pytest.fixture()
def run_stage(tmp_path: Path) -> Iterator[Callable[..., Stage]]:
    """Start stage processes; whatever a failing test leaves is killed afterwards."""
    stages: list[Stage] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Stage:
        stages.append(Stage(args, tmp_path, env))
        return stages[-1]

    yield start
    for stage in stages:
        stage.kill_all()


def sandbox_service(log_dir: Path) -> ServiceProcess:
    return python_service("sandbox", "sandbox.code", ["--workers", "1"], free_port(), log_dir)


PYTHON = sys.executable


def healthy(url: str) -> bool:
    """GET `url` answers 200 (False while nothing listens or it errs)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class _Scripted(BaseHTTPRequestHandler):
    """The `scripted` server's handler: `status` and `body` are set by the test; `requests` counts POSTs."""

    protocol_version = "HTTP/1.1"
    status = 200
    body = b"{}"
    release = threading.Event()  # a "hanging" server waits on this instead of answering

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            type(self).requests += 1
        if self.status == 0:
            self.release.wait(60)
            return
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


@pytest.fixture()
def scripted() -> Iterator[type[_Scripted]]:
    """A loopback HTTP server answering every POST with `status` and `body` (0: no answer at all)."""
    handler = type("Handler", (_Scripted,), {"release": threading.Event(), "requests": 0, "lock": threading.Lock()})
    with serving(handler) as url:
        handler.url = url
        yield handler
