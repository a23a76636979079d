"""Shared pieces of the sandbox tests: the server handle, uid range and process scan."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from pipeline.services.processes import ServiceProcess

WORKERS = 2
# Our own uid range, so other sandboxes on this host (other test runs, services) never look
# like processes our snippets left behind.
UID_BASE = 3_000_000 + 256 * (os.getpid() % 50_000)
LONE_UID_BASE = UID_BASE + 64  # the one-worker sandbox (`lone_sandbox`)


@dataclass(frozen=True)
class Sandbox:
    service: ServiceProcess
    secret: str

    @property
    def url(self) -> str:
        return self.service.url

    @property
    def port(self) -> int:
        return self.service.port

    def run(self, code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, **extra) -> dict:
        body = {"code": code, "timeout_s": timeout_s, "memory_mb": memory_mb, **extra}
        response = httpx.post(f"{self.url}/run", json=body, timeout=timeout_s + 30)
        assert response.status_code == 200, response.text
        return response.json()

    def health(self) -> dict:
        response = httpx.get(f"{self.url}/health", timeout=10)
        assert response.status_code == 200, response.text
        return response.json()


def sandbox_processes(uid_base: int = UID_BASE, workers: int = WORKERS) -> list[int]:
    """PIDs of processes owned by the sandbox's snippet uids (there should never be any after a request)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:  # not st_uid: a non-dumpable process's /proc entry is owned by root
            status = Path(entry.path, "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        if any(uid_base <= int(uid) < uid_base + workers for uid in uid_line.split()[1:]):
            pids.append(int(entry.name))
    return pids


def wait_until(predicate, timeout_s: float = 60.0, step_s: float = 0.05) -> bool:
    """Poll `predicate` until it holds; a generous liveness bound, never a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step_s)
    return True


def worker_processes(server_pid: int) -> list[psutil.Process]:
    """The server's worker processes (`python -m sandbox.code.worker`), not their zygotes."""
    server = psutil.Process(server_pid)
    return [p for p in server.children() if "sandbox.code.worker" in " ".join(p.cmdline())]


def zygote_of(worker: psutil.Process) -> psutil.Process:
    (zygote,) = worker.children()
    return zygote


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
