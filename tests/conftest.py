"""Fixtures shared by every test folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.paths import REPO_ROOT, shared_data_dir
from pipeline.services import ServiceProcess, redis_service


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark files beside the repository (see ../shared/data/SOURCES.md)."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.fail(f"shared benchmark data not found at {path} (set TAPO_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A private redis-server on a free loopback port for the whole session."""
    with redis_service(tmp_path_factory.mktemp("redis")) as service:
        yield service
