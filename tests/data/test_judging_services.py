"""Judges whose tool calls run through the project's real search service and code sandbox."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline.config.curate import CurateConfig, JudgeConfig, MultiLLMConfig, SourceConfig
from pipeline.config.search import SearchConfig
from pipeline.data.curate import run
from sandbox.search.build_index import build_index
from pipeline.services.processes import ServiceProcess, free_port, python_service
from pipeline.tools.search import format_results
from tests.data.openai_server import Script, ScriptedOpenAIServer

PARAGRAPHS = "hotpotqa_distractor_sample/hotpot_distractor_sample100_paragraphs.jsonl"
QUESTIONS = "hotpotqa_distractor_sample/hotpot_distractor_sample100.jsonl"


def _search_service(shared: Path, redis_url: str, tmp: Path) -> ServiceProcess:
    index_dir = tmp / "index"
    build_index(SearchConfig(corpus_path=str(shared / PARAGRAPHS), corpus_format="jsonl", index_dir=str(index_dir)))
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"extends": "defaults", "search": {"index_dir": str(index_dir)}}))
    return python_service("search", "sandbox.search", ["--redis-url", redis_url, "--params", str(params)], free_port(), tmp)


def test_judges_use_the_real_search_and_code_services(shared_data: Path, redis_server: ServiceProcess,
                                                       tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the code sandbox isolates snippets with namespaces and uids, which needs root")
    rows = [{"question": r["question"].strip(), "answer": r["answer"].strip()}
            for r in map(json.loads, (shared_data / QUESTIONS).read_text().splitlines()[:8])]
    qfile = tmp_path / "hard.jsonl"
    qfile.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in rows))
    sandbox = python_service("sandbox", "sandbox.code", ["--workers", "1", "--uid-base", "62000"], free_port(), tmp_path)
    search = _search_service(shared_data, redis_server.url, tmp_path)
    script = Script(answers={r["question"]: r["answer"] for r in rows}, tool={"searcher": "search", "coder": "code"})
    with sandbox, search.start(timeout_s=60), ScriptedOpenAIServer(script) as llm:
        # What the searcher can know: whether the gold answer is in the service's top passages.
        found = {r["question"] for r in rows if r["answer"] in format_results(httpx.post(
            f"{search.url}/search", json={"query": r["question"], "top_k": 3}, timeout=30).json()["results"])}
        judges = tuple(JudgeConfig(name=m, base_url=llm.url, model=m) for m in ("searcher", "coder"))
        cfg = CurateConfig(
            calculator={"n_train": 0, "n_test": 0},
            sources=(SourceConfig(name="hard", path=str(qfile), adapter="hotpotqa", type="multihop", split="train",
                                  judge=True),),
            filters={"time_ambiguous": False},
            multi_llm=MultiLLMConfig(judges=judges, code_url=sandbox.url, search_url=search.url, backoff_s=0.1,
                                     cache_path=str(tmp_path / "judges.sqlite")),
            output_dir=str(tmp_path / "out"),
        )
        report = run(cfg)  # default tools: clients of code_url and search_url
    kept = {json.loads(line)["question"] for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()}
    assert kept == found and 0 < len(found) < len(rows)  # some answers are in the top passages, some not
    assert report.judges["coder"]["correct"] == len(rows)  # print(<answer>) ran in the sandbox for each
    assert report.judges["coder"]["tool_calls"] == len(rows) == report.judges["searcher"]["tool_calls"]
    assert report.judges["searcher"]["correct"] == len(found)
