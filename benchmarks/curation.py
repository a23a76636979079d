"""Curation throughput: rows/s over all shared benchmark files, and judge questions/s.

1. Curation: `pipeline.data.curate.run` on the TAPO mix (configs/curate-tapo-mix.yaml: every
   question file of the shared data, calculator off, no judges), against the baseline of only
   reading and JSON-decoding the same files (no adapters, filters, dedupe or writing).
2. Multi-LLM filtering: questions/s through `judge_filter` against the scripted loopback
   OpenAI-compatible server (its own process) with injected latency per request, two judges
   (one calls a search tool first, so 3 requests a question), fresh cache, at concurrency 1
   (baseline) and 32. `ratio` = c32 / c1.

Usage (from the repository root): python benchmarks/curation.py [--latency-ms 25] [--questions 48] [--rows N] [--quick]
(`--rows`: at most N rows of each source; default all). The last line of output is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402
from pipeline.config.curate import CurateConfig, JudgeConfig, MultiLLMConfig, SourceConfig  # noqa: E402
from pipeline.data.curate import run  # noqa: E402
from pipeline.data.formats import read_file  # noqa: E402
from pipeline.data.judging import judge_filter  # noqa: E402
from pipeline.paths import shared_data_dir  # noqa: E402
from pipeline.types import Problem, ToolResult  # noqa: E402
from pipeline.services.processes import free_port, python_service  # noqa: E402

QUICK = {"latency_ms": 1.0, "questions": 4, "rows": 20}


def mix_config(out: Path, rows: int) -> CurateConfig:
    """The TAPO mix's curation (its params file, loaded strictly), at most `rows` rows a source (0: all)."""
    cfg = harness.derive(params=REPO / "configs" / "curate-tapo-mix.yaml").curate
    shared = shared_data_dir()
    sources = tuple(s.model_copy(update={"path": str(shared / s.path.split("shared/data/", 1)[1]), "judge": False,
                                         "limit": rows or s.limit})
                    for s in cfg.sources)
    return cfg.model_copy(update={"sources": sources, "calculator": cfg.calculator.model_copy(update={"n_train": 0, "n_test": 0}),
                                  "output_dir": str(out)})


def bench_curation(rows: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = mix_config(Path(tmp) / "out", rows)
        started = time.perf_counter()
        rows_parsed = sum(1 for s in cfg.sources for _ in itertools.islice(read_file(Path(s.path), s.format),
                                                                           s.limit or None))
        parse_s = time.perf_counter() - started
        started = time.perf_counter()
        report = run(cfg)
        curate_s = time.perf_counter() - started
    rows = report.run_stats["rows_read"]
    assert rows == rows_parsed, (rows, rows_parsed)
    return {"rows": rows, "sources": len(cfg.sources), "curate_s": round(curate_s, 3),
            "curate_rows_per_s": round(rows / curate_s, 1), "parse_only_rows_per_s": round(rows_parsed / parse_s, 1),
            "kept_train": report.n_train, "kept_test": report.n_test, "rejected": report.n_rejected}


class EchoSearch:
    name = "search"

    async def __call__(self, call_input: str) -> ToolResult:
        return ToolResult(f"Doc 1 (Title: Q) {call_input} -> answer-{zlib.crc32(call_input.encode()) % 97}", ok=True)

    async def aclose(self) -> None:
        pass


def bench_judges(n_questions: int, latency_s: float, concurrency: int, work: Path) -> dict[str, float]:
    questions = [f"Benchmark question number {i}?" for i in range(n_questions)]
    answers = {q: f"answer-{zlib.crc32(q.encode()) % 97}" for q in questions}
    problems = [Problem(id=f"b-{i}", question=q, answers=(answers[q],), type="fact", source="bench", split="train")
                for i, q in enumerate(questions)]
    script = work / f"script-{concurrency}.json"
    script.write_text(json.dumps({"answers": answers, "tool": {"searcher": "search"}, "latency_s": latency_s}))
    server = python_service(f"judge-server-{concurrency}", "tests.data.openai_server", ["--script", str(script)],
                            free_port(), work)
    with server:
        judges = tuple(JudgeConfig(name=m, base_url=server.url + "/v1", model=m) for m in ("plain", "searcher"))
        cfg = CurateConfig(
            calculator={"n_train": 0, "n_test": 0},
            sources=(SourceConfig(name="bench", path=str(script), adapter="hotpotqa", type="fact", split="train",
                                  judge=True),),
            multi_llm=MultiLLMConfig(judges=judges, concurrency=concurrency, cache_path=str(work / f"c{concurrency}.sqlite")),
            output_dir=str(work / "out"),
        )
        started = time.perf_counter()
        kept, rejected, _, stats = judge_filter(problems, cfg, lambda: {"search": EchoSearch()})
        elapsed = time.perf_counter() - started
    assert len(kept) == n_questions and not rejected, [r.reason for r in rejected[:3]]
    return {"questions_per_s": round(n_questions / elapsed, 2), "requests": stats["judge_requests"],
            "wall_s": round(elapsed, 3), "cache_hits": stats["judge_cache_hits"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=25.0, help="Injected latency per judge request.")
    parser.add_argument("--questions", type=int, default=48, help="Questions judged per concurrency setting.")
    parser.add_argument("--rows", type=int, default=0, help="At most this many rows of each source (0: all).")
    args = harness.parse(parser, argv, QUICK)
    os.chdir(REPO)  # the judge server runs as `python -m tests.data.openai_server`
    curation = bench_curation(args.rows)
    print(f"curation: {curation}")
    with tempfile.TemporaryDirectory() as tmp:
        c1 = bench_judges(args.questions, args.latency_ms / 1000, 1, Path(tmp))
        print(f"judges c=1: {c1}")
        c32 = bench_judges(args.questions, args.latency_ms / 1000, 32, Path(tmp))
        print(f"judges c=32: {c32}")
    harness.last_line({
        "curate_rows_per_s": curation["curate_rows_per_s"], "parse_only_rows_per_s": curation["parse_only_rows_per_s"],
        "rows": curation["rows"], "judge_latency_ms": args.latency_ms, "judge_questions": args.questions, "judges": 2,
        "judge_qps_c1": c1["questions_per_s"], "judge_qps_c32": c32["questions_per_s"],
        "ratio": round(c32["questions_per_s"] / c1["questions_per_s"], 2), "rows_per_source": args.rows or "all",
    }, args.quick)


if __name__ == "__main__":
    main()
