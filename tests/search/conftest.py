"""Fixtures for the search tests: a small real-Wikipedia index, params files, the guard pairs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.config.search import SearchConfig
from pipeline.search.bm25 import index_vocabulary
from pipeline.search.build_index import build_index

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
    path.write_text(yaml.safe_dump({"search": search}))
    return path


@pytest.fixture()
def params_file(tmp_path: Path, hotpot_index: Path) -> Iterator[Path]:
    yield write_params(tmp_path / "params.yaml", index_dir=str(hotpot_index))
