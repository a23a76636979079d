"""Start and stop the tool services as child processes on 127.0.0.1.

Used by the services flow and by tests. A `ServiceProcess` runs a command, waits until
its health URL answers (or a TCP port accepts, for Redis), and on `stop()` terminates
the whole process group, so nothing outlives the run; on Linux a service also gets SIGTERM
when its parent dies without stopping it (killed, even by SIGKILL). Output goes to a log file whose
tail is quoted when start-up fails.

A `ServiceSupervisor` watches running services from a thread and restarts one that exited or
stopped answering its health check (on the same port, so its URL stays valid), a bounded number
of times, logging each restart and each give-up.

Stopping is bounded, so an interrupted stage ends promptly: `stop_all` stops services in parallel, each
SIGTERM then SIGKILL within its grace; a start interrupted on the way (a signal, the supervisor stopped while it
restarts a service) stops what it started instead of waiting out its start-up timeout.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A currently unused TCP port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((LOOPBACK, port)) == 0


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def parent_death_signal(any_thread: bool = False):
    """A pre-exec hook that has Linux send the child SIGTERM when this process dies, so a service
    (the sandbox runs hostile code) never outlives a parent killed before it could call stop().
    Only from the main thread unless `any_thread`: the signal is tied to the thread that forks, and
    a worker thread may end long before the service should (the supervisor's thread, which restarts
    services, lives until they are stopped). None elsewhere (other systems, other threads)."""
    on_main = threading.current_thread() is threading.main_thread()
    if not sys.platform.startswith("linux") or not (on_main or any_thread):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # looked up before the fork

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return die_with_parent


@dataclass
class ServiceProcess:
    """A child service. `url` is its base URL (http://... or redis://...)."""

    name: str
    command: list[str]
    port: int
    log_path: Path
    health_path: str | None = "/health"  # None: ready when the TCP port accepts
    scheme: str = "http"
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 60.0, *, any_thread: bool = False,
              cancel: threading.Event | None = None) -> ServiceProcess:
        """Start and wait until healthy; `cancel` set on the way (or any exception, a signal's included) stops
        the process again instead of leaving it half-started."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,  # own process group: stop() kills children too
            preexec_fn=parent_death_signal(any_thread),
        )
        log.close()
        try:
            self._wait_ready(timeout_s, cancel)
        except BaseException:
            self.stop(grace_s=2.0)
            raise
        return self

    def _wait_ready(self, timeout_s: float, cancel: threading.Event | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                raise RuntimeError(f"{self.name}: start-up cancelled")
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode} during start-up:\n{self.log_tail()}")
            if self._healthy():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not healthy after {timeout_s:.0f}s on port {self.port}:\n{self.log_tail()}")

    def _healthy(self) -> bool:
        if self.health_path is None:
            return _port_open(self.port)
        try:
            return httpx.get(self.url + self.health_path, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, n_lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n_lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 5.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(grace_s)
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        """Running and answering its health check (or accepting on its port)."""
        return self.process is not None and self.process.poll() is None and self._healthy()

    def __enter__(self) -> ServiceProcess:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all(services: list[ServiceProcess], grace_s: float = 5.0) -> None:
    """Stop every service at once, each in its own thread: the whole takes one service's bound (SIGTERM, `grace_s`,
    SIGKILL, `grace_s`), not the sum of them."""
    threads = [threading.Thread(target=s.stop, args=(grace_s,), name=f"stop-{s.name}", daemon=True)
               for s in services]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * grace_s + 1.0)


def redis_service(data_dir: Path, port: int | None = None) -> ServiceProcess:
    """A private redis-server on loopback with its own data directory (AOF on, so it survives restarts)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server not found: run ./setup.sh as root, or apt-get install redis-server")
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [
        binary, "--bind", LOOPBACK, "--port", str(port), "--dir", str(data_dir),
        "--appendonly", "yes", "--save", "", "--protected-mode", "yes", "--daemonize", "no",
    ]
    return ServiceProcess("redis", command, port, data_dir / "redis.log", health_path=None, scheme="redis")


def python_service(name: str, module: str, args: list[str], port: int, log_dir: Path) -> ServiceProcess:
    """A `python -m module --host 127.0.0.1 --port PORT ...` service from this environment."""
    command = [sys.executable, "-m", module, "--host", LOOPBACK, "--port", str(port), *args]
    return ServiceProcess(name, command, port, log_dir / f"{name}.log")


class ServiceSupervisor:
    """Restarts services that die, from a daemon thread: at most `max_restarts` times each.

    A service counts as dead when its process exited, or when its health check failed
    `unhealthy_polls` times in a row (hung). Each restart and each give-up is reported through
    `log` (and counted in `restarts`); a service given up on stays down, and the clients' outage
    accounting then stops the run that needs it, naming it."""

    def __init__(self, services: list[ServiceProcess], *, interval_s: float = 1.0, max_restarts: int = 3,
                 unhealthy_polls: int = 3, start_timeout_s: float = 60.0, log=None) -> None:
        self.services = services
        self.interval_s = interval_s
        self.max_restarts = max_restarts
        self.unhealthy_polls = unhealthy_polls
        self.start_timeout_s = start_timeout_s
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.restarts: dict[str, int] = {s.name: 0 for s in services}
        self.given_up: set[str] = set()
        self._misses: dict[str, int] = {s.name: 0 for s in services}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="service-supervisor", daemon=True)

    def __enter__(self) -> ServiceSupervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # also cancels a restart in progress (ServiceProcess.start's `cancel`)
        self._thread.join(timeout=self.interval_s + 5.0)  # a health check takes at most ~1 s

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            for service in self.services:
                if service.name not in self.given_up and not self._stop.is_set():
                    self.poll(service)

    def poll(self, service: ServiceProcess) -> None:
        """One health check of `service`; restarts it when it is dead (see the class)."""
        exited = service.process is None or service.process.poll() is not None
        if not exited and service._healthy():
            self._misses[service.name] = 0
            return
        self._misses[service.name] += 1
        if not exited and self._misses[service.name] < self.unhealthy_polls:
            return
        why = f"exited with code {service.process.returncode}" if exited and service.process else "stopped answering"
        if self.restarts[service.name] >= self.max_restarts:
            self.given_up.add(service.name)
            self.log(f"error: service {service.name} at {service.url} {why}; not restarted again after "
                     f"{self.max_restarts} restart(s). Log tail:\n{service.log_tail(10)}")
            return
        self.restarts[service.name] += 1
        self.log(f"warning: service {service.name} at {service.url} {why}; restarting it "
                 f"({self.restarts[service.name]} of {self.max_restarts})")
        service.stop(grace_s=2.0)
        try:
            service.start(self.start_timeout_s, any_thread=True, cancel=self._stop)
            self._misses[service.name] = 0
            self.log(f"service {service.name} restarted at {service.url}")
        except (OSError, RuntimeError, TimeoutError) as err:
            if not self._stop.is_set():  # else the run is ending: nothing failed
                self.log(f"error: restarting service {service.name} failed: {err}")
