"""learning_cpu's held-out evaluation: all problems in one rollout batch of B rows vs chunks of 16.

`benchmarks/learning_cpu.py` evaluates three models (prompted base, SFT, SFT + DAPO) greedy on the same
80 held-out problems, each through the evaluation harness (`pipeline.evaluation.evaluate.run`) as
params.yaml configures it: chunks of `evaluate.chunk_problems` = 16 problems, up to
`rollout.max_batch_sequences` = 16 rows decoded together (the baseline). A chunk ends with its slowest
row, and on 2 CPU cores a decoding step of 135M weights costs nearly as much for a few rows as for a
full batch, so each chunk's tail is paid five times. Ours: every problem in one chunk and B rows.

With the real code sandbox and search service (its Redis cache flushed before each run), each setting
evaluates the same model on the same problems in turn; the responses must be the same as the
baseline's (greedy decoding: batching must not change an answer).

    python -m benchmarks.eval_batching [--run runs/learning_cpu] [--model sft] [--batch 32 48]

`--run` is a learning_cpu output dir (its test.jsonl and the model dir `--model` inside it, or a path).
The last line is one JSON object; `ratio` = ours (the first --batch) / baseline questions per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import redis

from benchmarks.learning_cpu import BOTH_TOOLS, FULL, evaluate_model
from flows.services import running_services
from pipeline.config import RunConfig, load_config
from pipeline.jsonl import iter_json_lines
from pipeline.paths import REPO_ROOT
from pipeline.services.processes import redis_service


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/learning_cpu", help="a learning_cpu output dir (test.jsonl, models)")
    parser.add_argument("--model", default="sft", help="model dir inside --run (or a path)")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 48], help="rows decoded together, ours")
    return parser.parse_args()


def setting(cfg: RunConfig, chunk: int, batch: int) -> RunConfig:
    return cfg.model_copy(update={
        "evaluate": cfg.evaluate.model_copy(update={"chunk_problems": chunk}),
        "rollout": cfg.rollout.model_copy(update={"max_batch_sequences": batch})})


def responses(eval_dir: Path) -> dict[str, str]:
    return {r["id"]: r["response"] for _, r in iter_json_lines(eval_dir / "eval_samples.jsonl")}


def main() -> None:
    args = parse_args()
    run = Path(args.run)
    test, model = run / "test.jsonl", Path(args.model) if Path(args.model).is_dir() else run / args.model
    for path in (test, model / "config.json"):
        if not path.is_file():
            sys.exit(f"{path} is missing: run benchmarks/learning_cpu.py --out {run} first (its cold start)")
    n = sum(1 for _ in iter_json_lines(test))
    work = Path(tempfile.mkdtemp(prefix="eval-batching-"))
    cfg = load_config(REPO_ROOT / "params.yaml", overrides={"run.tracking_uri": f"sqlite:///{work / 'mlruns.db'}"})
    settings = {"baseline": (cfg.evaluate.chunk_problems, cfg.rollout.max_batch_sequences)} | {
        f"ours_batch{b}": (n, b) for b in args.batch}
    seconds, accuracy = {}, {}
    with redis_service(work / "redis") as cache:  # our own Redis, so the search cache can be flushed
        cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update={"redis_url": cache.url})})
        with running_services(cfg, BOTH_TOOLS, str(REPO_ROOT / "params.yaml"), log_dir=work / "logs") as urls:
            for name, (chunk, batch) in settings.items():
                redis.Redis.from_url(cache.url).flushdb()
                t0 = time.perf_counter()
                per_type = evaluate_model(setting(cfg, chunk, batch), urls, str(model), test, work / name,
                                          FULL.eval_tokens)
                seconds[name] = time.perf_counter() - t0
                accuracy[name] = round(per_type["mix"]["accuracy"], 3)
                print(f"{name} (chunk {chunk}, batch {batch}): {seconds[name]:.1f} s, mix accuracy {accuracy[name]}",
                      flush=True)
    baseline = responses(work / "baseline")
    first = f"ours_batch{args.batch[0]}"
    result = {
        "problems": n, "model": str(model), "settings": {k: {"chunk": c, "batch": b} for k, (c, b) in settings.items()},
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "questions_per_s": {k: round(n / v, 4) for k, v in seconds.items()}, "mix_accuracy": accuracy,
        "identical_responses": {k: round(sum(r == baseline[i] for i, r in responses(work / k).items()) / n, 3)
                                for k in settings if k != "baseline"},
        "output_dir": str(work), "ratio": round(seconds["baseline"] / seconds[first], 3),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
