"""Fixtures shared by every test folder."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.config.search import SearchConfig
from pipeline.paths import REPO_ROOT, shared_data_dir
from pipeline.services.processes import ServiceProcess, free_port, python_service, redis_service


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


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Prefect API server on loopback; yields its API URL (PREFECT_API_URL)."""
    home = tmp_path_factory.mktemp("prefect")
    port = free_port()
    prefect = str(Path(sys.executable).with_name("prefect"))
    env = {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": ""}
    service = ServiceProcess("prefect", [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                             port, home / "server.log", health_path="/api/health", env=env)
    with service.start(timeout_s=180):
        yield f"{service.url}/api"


@pytest.fixture(scope="session")
def code_sandbox_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real code sandbox service on a free loopback port."""
    logs = tmp_path_factory.mktemp("sandbox")
    with python_service("sandbox", "sandbox.code", ["--workers", "2"], free_port(), logs).start(timeout_s=120) as svc:
        yield svc.url


@pytest.fixture(scope="session")
def wiki_search_url(redis_server: ServiceProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real search service over the default corpus (the embedded Wikipedia dump), as the default run serves it."""
    from sandbox.search.build_index import build_index  # the vLLM environment (tests/vllm) has no BM25 package

    tmp = tmp_path_factory.mktemp("wiki-search")
    build_index(SearchConfig(index_dir=str(tmp / "index")))
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"extends": "defaults", "search": {"index_dir": str(tmp / "index")}}))
    service = python_service("search", "sandbox.search", ["--redis-url", redis_server.url, "--params", str(params)],
                             free_port(), tmp)
    with service.start(timeout_s=60):
        yield service.url


# Tiers: every test is exactly one, from where it lives and what it uses (a module may say `pytestmark =
# pytest.mark.<tier>` to override). `-m unit` is the quick loop while editing; CI runs all three.
TIERS = {
    "unit": "in one process, no service, no rank: seconds each (README's quick command)",
    "integration": "real services (sandbox, search, Redis, Prefect, vLLM servers), ranks or minutes of training",
    "e2e": "whole stages: dvc repro, faults injected into them, browsers",
}
E2E_FOLDERS = frozenset({"e2e"})  # and the fault modules that run whole stages (their pytestmark)
INTEGRATION_FOLDERS = frozenset({"distributed", "vllm", "matrix", "orchestration", "sandbox", "benchmarks",
                                 "inference", "search"})
SERVICE_FIXTURES = frozenset({"redis_server", "prefect_server", "code_sandbox_url", "wiki_search_url", "search_url",
                              "tool_urls"})


def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def tier_of(item: pytest.Item) -> str:
    declared = [name for name in TIERS if item.get_closest_marker(name) is not None]
    if declared:
        return declared[0]
    parts = Path(item.path).relative_to(REPO_ROOT / "tests").parts
    folder = parts[0] if len(parts) > 1 else ""
    if folder in E2E_FOLDERS:
        return "e2e"
    uses = set(getattr(item, "fixturenames", ()))
    if folder in INTEGRATION_FOLDERS or uses & SERVICE_FIXTURES or item.get_closest_marker("slow") is not None:
        return "integration"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(item))
