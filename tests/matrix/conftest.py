"""Fixtures of the configuration matrix: the real tool services and one cold-started model per protocol."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.matrix.cases")  # before the imports below: the invariants' asserts report their values

from pipeline.config import RunConfig, load_config
from pipeline.config.search import SearchConfig
from pipeline.jsonl import write_problems
from pipeline.paths import REPO_ROOT
from sandbox.search.build_index import build_index
from pipeline.services.processes import ServiceProcess
from pipeline.types import Problem
from tests.matrix.cases import FACTORS, overrides
from tests.matrix.toy_protocols import TASKS, build_protocol_model
from tests.search.conftest import HOTPOT_PARAGRAPHS, start_search, write_params


@pytest.fixture(scope="session")
def search_url(shared_data: Path, redis_server: ServiceProcess,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The search service over a BM25 index of 1,000 real HotpotQA paragraphs."""
    tmp = tmp_path_factory.mktemp("matrix-search")
    index_dir = tmp / "index"
    build_index(SearchConfig(corpus_path=str(shared_data / HOTPOT_PARAGRAPHS), corpus_format="jsonl",
                             index_dir=str(index_dir)))
    service = start_search(write_params(tmp / "params.yaml", index_dir=str(index_dir)), redis_server.url, tmp)
    yield service.url
    service.stop()


@pytest.fixture(scope="session")
def tool_urls(code_sandbox_url: str, search_url: str) -> dict[str, str]:
    """protocol -> the URL of the tool its cold-started model calls."""
    return {p: code_sandbox_url if task.tool == "code" else search_url for p, task in TASKS.items()}


@pytest.fixture(scope="session")
def protocol_models(tool_urls: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("matrix-models")
    models = {}
    for protocol in FACTORS["protocol"]:
        cfg = load_config(REPO_ROOT / "params.yaml", {"rollout.protocol": protocol, "search.top_k": 1,
                                                      "rollout.max_tool_output_chars": 200})
        models[protocol] = build_protocol_model(root / protocol, TASKS[protocol], cfg, tool_urls[protocol])
    return models


def row_config(row: dict[str, str], root: Path, model_dir: Path, tool_url: str, **extra) -> RunConfig:
    """The row's validated config (params.yaml and the row's overrides), with its problems written."""
    task = TASKS[row["protocol"]]
    train_file = root / "train.jsonl"
    p = task.problem
    write_problems(train_file, [Problem(f"{p.id}-{i}", p.question, p.answers, p.type, p.source, p.split)
                                for i in range(8)])
    return load_config(REPO_ROOT / "params.yaml",
                       overrides=overrides(row, root, model_dir, train_file, tool_url) | extra)
