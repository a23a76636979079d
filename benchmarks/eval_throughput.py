"""Evaluation throughput: questions/s of the harness vs the same evaluation one question at a time.

With the embedded model (models/base, prepared if missing) and the real tool services (code
sandbox; search over the local BM25 index, with its Redis cache), it evaluates GSM8K and NQ
questions with tools, greedy, twice on the same problems:

- ours: the harness as configured (`chunk_problems` problems per rollout batch, continuous
  batching of up to `rollout.max_batch_sequences` sequences, tool calls overlapped with decoding);
- baseline: `chunk_problems = 1`, i.e. one question at a time, as a per-question loop would.

Both runs write their own output dir with resume off. The search cache is flushed before each
run so neither profits from the other's queries. Figures depend on the machine's other load.

    python -m benchmarks.eval_throughput [--limit 100] [--params params.yaml] [--model models/base]

`--limit` is per benchmark (100 = 200 questions, the full size). The last line is one JSON
object; `ratio` = ours / baseline questions/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import redis

from flows.services import running_services
from pipeline.config import load_config
from pipeline.config.evaluate import BenchmarkConfig
from pipeline.evaluation.benchmarks import load_benchmarks
from pipeline.evaluation.evaluate import evaluate_engine, load_model, make_eval_tools
from pipeline.tracking.model_source import fingerprint
from pipeline.model import prepare_base_model
from pipeline.rollout.engine import RolloutEngine
from pipeline.services.processes import redis_service


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=100, help="questions per benchmark (GSM8K and NQ)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", default="models/base", help="model dir (prepared from model.path if missing)")
    parser.add_argument("--chunk", type=int, default=0, help="problems per rollout batch for ours (0 = params)")
    return parser.parse_args()


def config(args: argparse.Namespace, out_dir: Path, chunk: int):
    base = load_config(args.params)
    benches = (BenchmarkConfig(name="gsm8k"), BenchmarkConfig(name="nq"))
    evaluate = base.evaluate.model_copy(update={
        "model": args.model, "benchmarks": benches, "limit": args.limit, "samples": 1, "temperature": 0.0, "mode": "tools",
        "output_dir": str(out_dir), "resume": False, "plots": out_dir.name == "ours", "compare_dirs": (),
        "chunk_problems": chunk or base.evaluate.chunk_problems})
    return base.model_copy(update={"evaluate": evaluate})


def timed_run(cfg, model, tokenizer, model_id: str, urls: dict, redis_url: str) -> tuple[float, dict]:
    redis.Redis.from_url(redis_url).flushdb()  # neither run may reuse the other's search results
    benchmarks = load_benchmarks(cfg.evaluate)
    engine = RolloutEngine(model, tokenizer, make_eval_tools(cfg, benchmarks, urls), cfg.rollout, seed=cfg.run.seed)
    t0 = time.perf_counter()
    metrics = evaluate_engine(cfg, engine, benchmarks, model_name=cfg.evaluate.model, model_id=model_id)
    return time.perf_counter() - t0, metrics


def same_responses(a: Path, b: Path) -> float:
    rows = [[json.loads(line)["response"] for line in (d / "eval_samples.jsonl").open()] for d in (a, b)]
    return sum(x == y for x, y in zip(*rows, strict=True)) / len(rows[0])


def main() -> None:
    args = parse_args()
    if not (Path(args.model) / "config.json").is_file():
        prepare_base_model(load_config(args.params).model.path, args.model)
    work = Path(tempfile.mkdtemp(prefix="eval-throughput-"))
    cfg_ours = config(args, work / "ours", args.chunk)
    cfg_base = config(args, work / "one_at_a_time", 1)
    model, tokenizer, resolved = load_model(cfg_ours, args.model)
    with redis_service(work / "redis") as cache:  # our own Redis, so its search cache can be flushed
        search = cfg_ours.search.model_copy(update={"redis_url": cache.url})
        cfg_ours, cfg_base = (c.model_copy(update={"search": search}) for c in (cfg_ours, cfg_base))
        with running_services(cfg_ours, ("code", "search"), args.params, log_dir=work / "logs") as urls:
            ours_s, ours = timed_run(cfg_ours, model, tokenizer, fingerprint(resolved), urls, cache.url)
            base_s, base = timed_run(cfg_base, model, tokenizer, fingerprint(resolved), urls, cache.url)
    n = ours["n_problems"]
    result = {
        "questions": n, "limit_per_benchmark": args.limit, "chunk_problems": cfg_ours.evaluate.chunk_problems,
        "max_batch_sequences": cfg_ours.rollout.max_batch_sequences,
        "ours_s": round(ours_s, 2), "baseline_s": round(base_s, 2),
        "ours_questions_per_s": round(n / ours_s, 4), "baseline_questions_per_s": round(n / base_s, 4),
        "ours_accuracy": {b: round(ours[f"{b}/accuracy"], 3) for b in ("gsm8k", "nq")},
        "baseline_accuracy": {b: round(base[f"{b}/accuracy"], 3) for b in ("gsm8k", "nq")},
        "calls_per_rollout": {f"{b}/{t}": round(ours[f"{b}/calls_per_rollout/{t}"], 3)
                              for b in ("gsm8k", "nq") for t in ("code", "search")},
        "identical_responses": round(same_responses(work / "ours", work / "one_at_a_time"), 3),
        "output_dir": str(work),
        "ratio": round(base_s / ours_s, 3),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
