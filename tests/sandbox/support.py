"""Shared pieces of the sandbox tests: the server handle, uid range and process scan."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx

from pipeline.services import ServiceProcess

WORKERS = 2
# Our own uid range, so other sandboxes on this host (other test runs, services) never look
# like processes our snippets left behind.
UID_BASE = 3_000_000 + 256 * (os.getpid() % 50_000)


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


def sandbox_processes() -> list[int]:
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
        if any(UID_BASE <= int(uid) < UID_BASE + WORKERS for uid in uid_line.split()[1:]):
            pids.append(int(entry.name))
    return pids
