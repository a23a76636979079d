"""Benchmarks by name over the shared data files; bad names and files fail at once, naming them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.config import ConfigError, config_from_dict, load_config
from pipeline.config.evaluate import BenchmarkConfig, EvaluateConfig
from pipeline.evaluation.benchmarks import KNOWN, BenchmarkError, load_benchmark, load_benchmarks, unique_ids
from pipeline.evaluation.evaluate import tools_needed
from pipeline.jsonl import write_problems
from pipeline.types import Problem

TABLE_1_AND_ISSUE = ["gsm8k", "math500", "aime24", "aime25", "amc23", "nq", "triviaqa", "hotpotqa",
                     "2wikimultihopqa", "musique", "bamboogle"]


@pytest.mark.parametrize("name", TABLE_1_AND_ISSUE)
def test_known_benchmarks_read_the_shared_files(name: str, shared_data) -> None:
    bench = load_benchmark(BenchmarkConfig(name=name), default_limit=5)
    assert len(bench.problems) == 5 and bench.skipped_rows == 0
    assert str(shared_data) in bench.location
    assert all(p.source == name and p.answers and p.question for p in bench.problems)
    assert bench.category == KNOWN[name].category


def test_gsm8k_answers_and_per_benchmark_limit(shared_data) -> None:
    cfg = EvaluateConfig(limit=10, benchmarks=(BenchmarkConfig(name="gsm8k", limit=3), BenchmarkConfig(name="nq")))
    gsm8k, nq = load_benchmarks(cfg)
    assert [len(gsm8k.problems), len(nq.problems)] == [3, 10]
    assert gsm8k.problems[0].answers == ("18",)  # Janet's ducks
    assert nq.problems[0].question.endswith("?") and nq.category == "fact"
    assert tools_needed([gsm8k, nq]) == ("code", "search")


def test_unknown_benchmark_fails_at_config_load() -> None:
    with pytest.raises(ConfigError, match="unknown benchmark 'gsm9k'.*known are"):
        config_from_dict({"evaluate": {"benchmarks": [{"name": "gsm9k"}]}}, "params.yaml")


def test_custom_benchmark_needs_adapter_type_and_location(tmp_path) -> None:
    with pytest.raises(ValidationError, match="custom benchmark needs"):
        BenchmarkConfig(name="mine", path=str(tmp_path / "x.jsonl"))
    path = tmp_path / "mine.jsonl"
    path.write_text('{"question": "Who?", "answer": ["Me"]}\n{"question": 3}\n')
    bench = load_benchmark(BenchmarkConfig(name="mine", path=str(path), adapter="nq_open", type="fact"), 0)
    assert [p.question for p in bench.problems] == ["Who?"] and bench.skipped_rows == 1
    assert bench.category == "fact"


def test_missing_file_names_the_benchmark(tmp_path) -> None:
    with pytest.raises(BenchmarkError, match=r"benchmark 'gsm8k'.*nope\.jsonl: no such file"):
        load_benchmark(BenchmarkConfig(name="gsm8k", path=str(tmp_path / "nope.jsonl")), 0)
    with pytest.raises(BenchmarkError, match="benchmark 'complex' has no default file"):
        load_benchmark(BenchmarkConfig(name="complex"), 0)


def test_file_without_usable_rows_fails(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "no answer marker", "answer": "42"}\n')
    with pytest.raises(BenchmarkError, match="'gsm8k'.*no usable problems"):
        load_benchmark(BenchmarkConfig(name="gsm8k", path=str(path)), 0)


def test_split_file_groups_by_source_and_caps_each(tmp_path) -> None:
    rows = [Problem(f"c{i}", f"q{i}", ("1",), "calculator", "calculator", "test") for i in range(4)]
    rows += [Problem(f"n{i}", f"w{i}?", ("x",), "fact", "nq", "test") for i in range(2)]
    path = tmp_path / "test.jsonl"
    write_problems(path, rows)
    calc, nq = load_benchmarks(EvaluateConfig(split_file=str(path), limit=3))
    assert (calc.name, len(calc.problems), calc.category) == ("calculator", 3, "math")
    assert (nq.name, len(nq.problems), nq.category) == ("nq", 2, "fact")


def test_missing_split_file_is_named(tmp_path) -> None:
    with pytest.raises(BenchmarkError, match="test.jsonl: no such file"):
        load_benchmarks(EvaluateConfig(split_file=str(tmp_path / "test.jsonl")))


def test_repeated_questions_get_distinct_ids() -> None:
    p = Problem("gsm8k-abc", "q", ("1",), "math", "gsm8k", "test", {"line": 7})
    assert [x.id for x in unique_ids([p, p])] == ["gsm8k-abc", "gsm8k-abc#7"]


def test_pass_k_above_samples_is_rejected() -> None:
    with pytest.raises(ValidationError, match="pass_k values"):
        EvaluateConfig(samples=2, pass_k=(1, 4))


def test_example_benchmarks_config_loads_every_benchmark(repo_root, shared_data) -> None:
    cfg = load_config(repo_root / "configs" / "evaluate-benchmarks.yaml", {"evaluate.limit": 2})
    shared = [b for b in cfg.evaluate.benchmarks if b.name != "calculator"]  # calculator is a DVC output
    names = [b.name for b in load_benchmarks(cfg.evaluate.model_copy(update={"benchmarks": tuple(shared)}))]
    assert set(TABLE_1_AND_ISSUE) <= set(names)
