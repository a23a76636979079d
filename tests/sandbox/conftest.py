"""A real code sandbox on a loopback port, shared by the sandbox tests.

It runs with two workers (so a hostile snippet and a concurrent benign one each get a
worker) and with a secret in the server's environment, which no snippet may ever see.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.services.processes import free_port, python_service
from tests.sandbox.support import LONE_UID_BASE, UID_BASE, WORKERS, Sandbox


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.fail("the sandbox tests need root: the service isolates snippets with namespaces and uids")
    secret = f"tapo-secret-{uuid.uuid4().hex}"
    logs: Path = tmp_path_factory.mktemp("sandbox-logs")
    service = python_service("sandbox", "sandbox.code",
                             ["--workers", str(WORKERS), "--uid-base", str(UID_BASE)], free_port(), logs)
    service.env["TAPO_TEST_SECRET"] = secret
    with service:
        yield Sandbox(service, secret)


@pytest.fixture(scope="session")
def lone_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One worker, so consecutive requests share it: what one leaves, the next would find.
    Tests on it may kill its worker; they wait for the replacement before they end."""
    logs: Path = tmp_path_factory.mktemp("lone-sandbox-logs")
    service = python_service("lone-sandbox", "sandbox.code", ["--workers", "1", "--uid-base", str(LONE_UID_BASE)],
                             free_port(), logs)
    with service:
        yield Sandbox(service, "")
