"""Benchmarks by name: where their file is, how rows become `Problem`s, and their Table-1 group.

Known benchmarks read the shared data files (`pipeline.paths.shared_data_dir()`) through the
data stage's adapters; a configured `path` or `hub_id` replaces the file. Calculator and
Complex are curated Problem JSONL (the generator's test split; Complex-8K has no public file,
so its path must be given). Every benchmark is read in full before any model is loaded, so a
missing file or an unreadable row source fails at once, naming the benchmark.

Problem ids are the data stage's `<name>-<sha1(question)>`; a question repeated inside one
benchmark gets `#<line>` appended so every row is evaluated and keyed once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config.curate import SourceConfig
from pipeline.config.evaluate import BenchmarkConfig, EvaluateConfig
from pipeline.data.formats import SourceError
from pipeline.data.sources import Rejection, load_source
from pipeline.jsonl import read_problems
from pipeline.paths import REPO_ROOT, shared_data_dir
from pipeline.types import Problem


@dataclass(frozen=True)
class KnownBenchmark:
    file: str  # relative to the shared data directory ("" = none published; Complex)
    adapter: str
    type: str
    category: str
    in_repo: bool = False  # file relative to the repository (curated splits), not shared data


KNOWN: dict[str, KnownBenchmark] = {
    "gsm8k": KnownBenchmark("gsm8k/test.jsonl", "gsm8k", "math", "math"),
    "math500": KnownBenchmark("math500/test.jsonl", "math", "math", "math"),
    "math": KnownBenchmark("math/test.jsonl", "math", "math", "math"),
    "aime24": KnownBenchmark("aime24/test.jsonl", "aime", "math", "math"),
    "aime25": KnownBenchmark("aime25/test.jsonl", "aime", "math", "math"),
    "amc23": KnownBenchmark("amc23/test.jsonl", "amc", "math", "math"),
    "olympiadbench": KnownBenchmark("olympiadbench/test.jsonl", "olympiadbench", "math", "math"),
    "minerva_math": KnownBenchmark("minerva_math/test.jsonl", "math", "math", "math"),
    "deepmath": KnownBenchmark("deepmath_103k_subset/math_deepmath_deal.jsonl", "deepmath", "math", "math"),
    "nq": KnownBenchmark("nq_open/NQ-open.dev.jsonl", "nq_open", "fact", "fact"),
    "nq_open": KnownBenchmark("nq_open/NQ-open.dev.jsonl", "nq_open", "fact", "fact"),
    "triviaqa": KnownBenchmark("triviaqa/test.jsonl", "triviaqa", "fact", "fact"),
    "popqa": KnownBenchmark("popqa/test.jsonl", "popqa", "fact", "fact"),
    "hotpotqa": KnownBenchmark("hotpotqa/hotpotqa_500.jsonl", "hotpotqa", "multihop", "fact"),
    "2wikimultihopqa": KnownBenchmark("2wikimultihopqa/2wiki_500.jsonl", "2wikimultihopqa", "multihop", "fact"),
    "musique": KnownBenchmark("musique/musique_500.jsonl", "musique", "multihop", "fact"),
    "bamboogle": KnownBenchmark("bamboogle/test.jsonl", "bamboogle", "multihop", "fact"),
    "calculator": KnownBenchmark("data/curated/test.jsonl", "problems", "calculator", "math", in_repo=True),
    "wiki_facts": KnownBenchmark("data/curated/test.jsonl", "problems", "fact", "fact", in_repo=True),
    "complex": KnownBenchmark("", "problems", "complex", "comprehensive"),
}
CATEGORY_OF_TYPE = {"math": "math", "calculator": "math", "code": "math", "fact": "fact", "multihop": "fact",
                    "complex": "comprehensive"}


class BenchmarkError(ValueError):
    """A benchmark that cannot be evaluated (unknown, missing file, no usable rows)."""


@dataclass(frozen=True)
class Benchmark:
    """A resolved benchmark: its problems in file order, capped by its limit."""

    name: str
    category: str
    location: str
    problems: tuple[Problem, ...]
    skipped_rows: int  # rows the adapter could not use (malformed)


def _resolved_file(cfg: BenchmarkConfig, known: KnownBenchmark | None) -> str:
    if cfg.path or cfg.hub_id:
        return cfg.path
    if known is None or not known.file:
        raise BenchmarkError(f"benchmark {cfg.name!r} has no default file; set its path (or hub_id)")
    base = REPO_ROOT if known.in_repo else shared_data_dir()
    return str(base / known.file)


def _read_problem_file(name: str, path: str, source_filter: str | None) -> list[Problem]:
    if not Path(path).is_file():
        raise BenchmarkError(f"benchmark {name!r}: {path}: no such file")
    try:
        problems = read_problems(path)
    except ValueError as err:
        raise BenchmarkError(f"benchmark {name!r}: {err}") from None
    return [p for p in problems if source_filter is None or p.source == source_filter]


def _read_source(cfg: BenchmarkConfig, path: str, adapter: str, type_: str, limit: int) -> tuple[list[Problem], int]:
    source = SourceConfig(name=cfg.name, path=path, hub_id=cfg.hub_id, hub_config=cfg.hub_config,
                          hub_split=cfg.hub_split, format=cfg.format, adapter=adapter, type=type_, split="test")
    problems: list[Problem] = []
    skipped = 0
    try:
        for item in load_source(source, seed=0, test_fraction=1.0):
            if isinstance(item, Rejection):
                skipped += 1
            else:
                problems.append(item)
            if limit and len(problems) >= limit:
                break
    except SourceError as err:
        raise BenchmarkError(f"benchmark {cfg.name!r}: {err}") from None
    return problems, skipped


def unique_ids(problems: list[Problem]) -> list[Problem]:
    seen: set[str] = set()
    out: list[Problem] = []
    for p in problems:
        if p.id in seen:
            p = Problem(f"{p.id}#{p.meta.get('line', len(out))}", p.question, p.answers, p.type, p.source, p.split, p.meta)
        seen.add(p.id)
        out.append(p)
    return out


def load_benchmark(cfg: BenchmarkConfig, default_limit: int) -> Benchmark:
    known = KNOWN.get(cfg.name)
    adapter = cfg.adapter or (known.adapter if known else "")
    type_ = cfg.type or (known.type if known else "")
    category = cfg.category or (known.category if known and not cfg.type else CATEGORY_OF_TYPE[type_])
    limit = cfg.limit or default_limit
    path = _resolved_file(cfg, known)
    if adapter == "problems":
        problems = _read_problem_file(cfg.name, path, cfg.name if known else None)
        skipped = 0
    else:
        problems, skipped = _read_source(cfg, path, adapter, type_, limit)
    problems = unique_ids(problems[:limit] if limit else problems)
    if not problems:
        raise BenchmarkError(f"benchmark {cfg.name!r} ({path or cfg.hub_id}): no usable problems")
    return Benchmark(cfg.name, category, path or f"hub:{cfg.hub_id}", tuple(problems), skipped)


def split_file_benchmarks(path: str, limit: int) -> list[Benchmark]:
    """The default: a curated split, one benchmark per problem source (in order of first appearance), in its
    known Table-1 group (a curated source offered both tools is still a math or fact column), else its type's."""
    problems = _read_problem_file(Path(path).name, path, None)
    by_source: dict[str, list[Problem]] = {}
    for p in problems:
        by_source.setdefault(p.source, []).append(p)
    if not by_source:
        raise BenchmarkError(f"{path}: no problems")
    return [Benchmark(name, KNOWN[name].category if name in KNOWN else CATEGORY_OF_TYPE[rows[0].type], path,
                      tuple(unique_ids(rows[:limit] if limit else rows)), 0)
            for name, rows in by_source.items()]


def load_benchmarks(cfg: EvaluateConfig) -> list[Benchmark]:
    """Every configured benchmark, read in full; raises BenchmarkError naming the first bad one."""
    if not cfg.benchmarks:
        return split_file_benchmarks(cfg.split_file, cfg.limit)
    return [load_benchmark(b, cfg.limit) for b in cfg.benchmarks]
