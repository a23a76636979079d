"""Evaluation throughput: questions/s of the harness vs the same evaluation one question at a time.

With the embedded model (models/base, prepared if missing) and the real tool services (code
sandbox; search over a BM25 index of the default corpus, with its Redis cache), it evaluates GSM8K and NQ
questions with tools, greedy, twice on the same problems:

- ours: the harness as configured (`chunk_problems` problems per rollout batch, continuous
  batching of up to `rollout.max_batch_sequences` sequences, tool calls overlapped with decoding);
- baseline: `chunk_problems = 1`, i.e. one question at a time, as a per-question loop would.

Both runs write their own output dir with resume off. The search cache is flushed before each
run so neither profits from the other's queries. Figures depend on the machine's other load.

    python -m benchmarks.eval_throughput [--limit 100] [--params params.yaml] [--model models/base] [--quick]

`--limit` is per benchmark (100 = 200 questions, the full size). The last line is one JSON
object; `ratio` = ours / baseline questions/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import redis

from benchmarks import harness
from benchmarks.preset_run import workspace
from benchmarks.services import tool_services
from pipeline.config import RunConfig
from pipeline.evaluation.benchmarks import load_benchmarks
from pipeline.evaluation.evaluate import evaluate_engine, load_model, make_eval_tools
from pipeline.jsonl import iter_json_lines
from pipeline.tracking.model_source import fingerprint
from pipeline.model import prepare_base_model
from pipeline.rollout.engine import RolloutEngine
from pipeline.services.processes import redis_service

BENCHMARKS = ("gsm8k", "nq")
QUICK = {"limit": 1}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=100, help="questions per benchmark (GSM8K and NQ)")
    parser.add_argument("--params", type=Path, default=None, help="default: params.yaml")
    parser.add_argument("--model", default=None,
                        help="model dir (default: models/base, prepared from model.path if missing; --quick: the "
                             "tiny one)")
    parser.add_argument("--chunk", type=int, default=0, help="problems per rollout batch for ours (0 = params)")
    return harness.parse(parser, argv, QUICK)


def config(params: Path, args: argparse.Namespace, out_dir: Path, chunk: int, redis_url: str) -> RunConfig:
    """The params' evaluation of GSM8K and NQ with tools, greedy, into `out_dir`, `chunk` problems a batch (0: the
    params' own), its search cache in `redis_url`."""
    base = harness.derive(params=params)
    return harness.derive({
        "evaluate.model": args.model, "evaluate.benchmarks": [{"name": name} for name in BENCHMARKS],
        "evaluate.limit": args.limit, "evaluate.samples": 1, "evaluate.temperature": 0.0, "evaluate.mode": "tools",
        "evaluate.output_dir": str(out_dir), "evaluate.resume": False, "evaluate.plots": out_dir.name == "ours",
        "evaluate.compare_dirs": [], "evaluate.chunk_problems": chunk or base.evaluate.chunk_problems,
        "search.redis_url": redis_url}, params)


def timed_run(cfg, model, tokenizer, model_id: str, urls: dict, redis_url: str) -> tuple[float, dict]:
    redis.Redis.from_url(redis_url).flushdb()  # neither run may reuse the other's search results
    benchmarks = load_benchmarks(cfg.evaluate)
    tools = make_eval_tools(cfg.evaluate.mode, cfg.rollout.tools, cfg.sandbox, cfg.search, benchmarks, urls)
    engine = RolloutEngine(model, tokenizer, tools, cfg.rollout, seed=cfg.run.seed)
    t0 = time.perf_counter()
    metrics = evaluate_engine(cfg, engine, benchmarks, model_name=cfg.evaluate.model, model_id=model_id)
    return time.perf_counter() - t0, metrics


def same_responses(a: Path, b: Path) -> float:
    rows = [[row["response"] for _, row in iter_json_lines(d / "eval_samples.jsonl")] for d in (a, b)]
    return sum(x == y for x, y in zip(*rows, strict=True)) / len(rows[0])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params = args.params or harness.base_params(args.quick)
    with workspace(None, args.quick) as root, tempfile.TemporaryDirectory(prefix="eval-throughput-") as tmp:
        args.model = args.model or str(root / "models" / ("sft" if args.quick else "base"))
        if not (Path(args.model) / "config.json").is_file():
            prepare_base_model(harness.derive(params=params).model.path, args.model)
        result = measure(params, args, Path(tmp))
    harness.last_line(result, args.quick)


def measure(params: Path, args: argparse.Namespace, work: Path) -> dict:
    """Both runs' seconds, accuracies and tool calls, and how many of their responses agree."""
    with redis_service(work / "redis") as cache:  # our own Redis, so its search cache can be flushed
        cfg_ours = config(params, args, work / "ours", args.chunk, cache.url)
        cfg_base = config(params, args, work / "one_at_a_time", 1, cache.url)
        model, tokenizer, resolved = load_model(args.model, cfg_ours.model, cfg_ours.run.tracking_uri)
        with tool_services(params, ("code", "search"), work, {"search.redis_url": cache.url}) as (_, urls):
            ours_s, ours = timed_run(cfg_ours, model, tokenizer, fingerprint(resolved), urls, cache.url)
            base_s, base = timed_run(cfg_base, model, tokenizer, fingerprint(resolved), urls, cache.url)
    n = ours["n_problems"]
    return {
        "questions": n, "limit_per_benchmark": args.limit, "chunk_problems": cfg_ours.evaluate.chunk_problems,
        "max_batch_sequences": cfg_ours.rollout.max_batch_sequences, "model": args.model,
        "ours_s": round(ours_s, 2), "baseline_s": round(base_s, 2),
        "ours_questions_per_s": round(n / ours_s, 4), "baseline_questions_per_s": round(n / base_s, 4),
        "ours_accuracy": {b: round(ours[f"{b}/accuracy"], 3) for b in BENCHMARKS},
        "baseline_accuracy": {b: round(base[f"{b}/accuracy"], 3) for b in BENCHMARKS},
        "calls_per_rollout": {f"{b}/{t}": round(ours[f"{b}/calls_per_rollout/{t}"], 3)
                              for b in BENCHMARKS for t in ("code", "search")},
        "identical_responses": round(same_responses(work / "ours", work / "one_at_a_time"), 3),
        "ratio": round(base_s / ours_s, 3),
    }


if __name__ == "__main__":
    sys.exit(main())
