"""Fixtures for the search tests: a small real-Wikipedia index, params files, the guard pairs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline.config.search import SearchConfig
from sandbox.search.bm25 import index_vocabulary
from sandbox.search.build_index import build_index
from pipeline.services.processes import ServiceProcess, free_port, python_service
from tests.search.fake_serper import API_KEY, FakeSerper

DATA = Path(__file__).parent / "data"
HOTPOT_PARAGRAPHS = "hotpotqa_distractor_sample/hotpot_distractor_sample100_paragraphs.jsonl"


def read_pairs(name: str) -> list[tuple[str, str]]:
    pairs = []
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            query, cached = line.split("\t")
            pairs.append((query, cached))
    return pairs


@pytest.fixture(scope="session")
def hotpot_index(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BM25 index over the 1,000 HotpotQA distractor paragraphs (real Wikipedia text)."""
    index_dir = tmp_path_factory.mktemp("search") / "hotpot-index"
    cfg = SearchConfig(corpus_path=str(shared_data / HOTPOT_PARAGRAPHS), corpus_format="jsonl", index_dir=str(index_dir))
    build_index(cfg)
    return index_dir


@pytest.fixture(scope="session")
def default_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default index: the Wikipedia dump excerpt from the gensim wheel."""
    index_dir = tmp_path_factory.mktemp("search") / "default-index"
    build_index(SearchConfig(index_dir=str(index_dir)))
    return index_dir


@pytest.fixture(scope="session")
def known_words(default_index: Path) -> frozenset[str]:
    return index_vocabulary(default_index)


def write_params(path: Path, **search: object) -> Path:
    path.write_text(yaml.safe_dump({"extends": "defaults", "search": search}))
    return path


def start_search(params: Path, redis_url: str, log_dir: Path, env: dict[str, str] | None = None) -> ServiceProcess:
    service = python_service("search", "sandbox.search", ["--redis-url", redis_url, "--params", str(params)],
                             free_port(), log_dir)
    service.env = env or {}
    service.start(timeout_s=60)
    deadline = time.monotonic() + 30
    while httpx.get(f"{service.url}/stats").json()["index_loading"] and time.monotonic() < deadline:
        time.sleep(0.05)  # the persisted fuzzy index loads in the background
    return service


def search(service: ServiceProcess, query: str, top_k: int = 3) -> httpx.Response:
    return httpx.post(f"{service.url}/search", json={"query": query, "top_k": top_k}, timeout=10)


@pytest.fixture(scope="session")
def local_service(hotpot_index: Path, redis_server: ServiceProcess,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("local-service")
    params = write_params(tmp / "params.yaml", index_dir=str(hotpot_index), fuzzy=True)  # TAPO's cache, both lookups
    service = start_search(params, redis_server.url, tmp)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def serper_service(redis_server: ServiceProcess, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[ServiceProcess, FakeSerper]]:
    tmp = tmp_path_factory.mktemp("serper-service")
    with FakeSerper() as fake:
        params = write_params(tmp / "params.yaml", provider="serper", serper_url=fake.url, provider_timeout_s=0.5,
                              provider_retries=1, index_dir=str(tmp / "no-index"))
        service = start_search(params, redis_server.url, tmp, env={"SERPER_API_KEY": API_KEY})
        yield service, fake
        service.stop()


