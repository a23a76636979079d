"""The learning-cpu preset's held-out evaluation: all problems in one rollout batch of B rows vs chunks of 16.

The learning-cpu preset (`configs/experiments/learning-cpu.yaml`, `benchmarks/learning_cpu.py`) evaluates three
models (prompted base, SFT, SFT + DAPO) greedy on the same held-out problems, each through the evaluation harness
(`pipeline.evaluation.evaluate.run`) in chunks of `evaluate.chunk_problems` = 16 problems. The baseline: those
chunks with up to 16 rows decoded together (`rollout.max_batch_sequences` when this was measured; the preset now
decodes 24). A chunk ends with its slowest row, and on 2 CPU cores a decoding step of 135M weights costs nearly as
much for a few rows as for a full batch, so each chunk's tail is paid once per chunk. Ours: every problem in one
chunk and B rows.

With the real code sandbox and search service (its Redis cache flushed before each run), each setting
evaluates the same model on the same problems in turn, as the preset configures the evaluation otherwise; the
responses must be the same as the baseline's (greedy decoding: batching must not change an answer).

    python -m benchmarks.eval_batching [--run WORKSPACE] [--model models/sft] [--batch 32 48] [--quick]

`--run` is a pipeline workspace where the learning-cpu preset ran (default: this repo; e.g. after
`dvc exp apply learning-cpu-s0`): its held-out problems (data/curated/test.jsonl) and the model `--model`
(a model dir inside it, or a path; default its SFT model).
The last line is one JSON object; `ratio` = ours (the first --batch) / baseline questions per second.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import redis

from benchmarks import harness
from benchmarks.preset_run import PresetRun, preset_config, preset_run_or_exit, workspace
from flows.common import tools_needed
from flows.services import running_services
from pipeline.config import RunConfig
from pipeline.evaluation import evaluate
from pipeline.jsonl import iter_json_lines
from pipeline.services.processes import redis_service

BASELINE_CHUNK, BASELINE_ROWS = 16, 16
QUICK = {"batch": [8]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="a pipeline workspace where the learning-cpu preset ran (its data/curated/test.jsonl "
                             "and models; default: this repo)")
    parser.add_argument("--model", default=None, help="model dir inside --run, or a path (default: its SFT model)")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 48], help="rows decoded together, ours")
    return harness.parse(parser, argv, QUICK)


def setting(cfg: RunConfig, name: str, chunk: int, batch: int) -> RunConfig:
    """The preset's evaluation of the held-out problems, in chunks of `chunk` problems and `batch` rows, to its own
    output dir (named as the setting), from scratch."""
    return cfg.model_copy(update={
        "evaluate": cfg.evaluate.model_copy(update={"chunk_problems": chunk, "resume": False, "plots": False,
                                                    "label": name,
                                                    "output_dir": str(Path(cfg.evaluate.output_dir) / name)}),
        "rollout": cfg.rollout.model_copy(update={"max_batch_sequences": batch})})


def responses(eval_dir: Path) -> dict[str, str]:
    return {r["id"]: r["response"] for _, r in iter_json_lines(eval_dir / "eval_samples.jsonl")}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with workspace(args.run, args.quick) as root, tempfile.TemporaryDirectory(prefix="eval-batching-") as tmp:
        result = measure(args, preset_run_or_exit(root), Path(tmp))
    harness.last_line(result, args.quick)


def measure(args: argparse.Namespace, run: PresetRun, work: Path) -> dict:
    """Each setting's seconds and accuracy, and how many of its responses are the baseline's."""
    model = run.sft if args.model is None else next(
        (p for p in (Path(args.model), run.root / args.model) if (p / "config.json").is_file()), None)
    if model is None:
        raise SystemExit(f"--model {args.model}: no model dir (config.json) there nor in {run.root}")
    n = sum(1 for _ in iter_json_lines(run.test))  # ours: every held-out problem in one chunk
    cfg = preset_config(run.root, work)
    settings = {"baseline": (BASELINE_CHUNK, BASELINE_ROWS)} | {f"ours_batch{b}": (n, b) for b in args.batch}
    seconds, accuracy, evaluated = {}, {}, 0
    with redis_service(work / "redis") as cache:  # our own Redis, so the search cache can be flushed
        cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update={"redis_url": cache.url})})
        with running_services(cfg, tools_needed(run.test), str(run.preset), log_dir=work / "logs") as urls:
            for name, (chunk, batch) in settings.items():
                redis.Redis.from_url(cache.url).flushdb()
                t0 = time.perf_counter()
                metrics = evaluate.run(setting(cfg, name, chunk, batch), urls, model_path=str(model))
                seconds[name] = time.perf_counter() - t0
                accuracy[name], evaluated = round(metrics["all/accuracy"], 3), int(metrics["n_problems"])
                print(f"{name} (chunk {chunk}, batch {batch}): {seconds[name]:.1f} s, mix accuracy {accuracy[name]}",
                      flush=True)
    out = Path(cfg.evaluate.output_dir)
    baseline = responses(out / "baseline")
    first = f"ours_batch{args.batch[0]}"
    result = {
        "problems": evaluated, "model": str(model),
        "settings": {k: {"chunk": c, "batch": b} for k, (c, b) in settings.items()},
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "questions_per_s": {k: round(evaluated / v, 4) for k, v in seconds.items()}, "mix_accuracy": accuracy,
        "identical_responses": {k: round(sum(r == baseline[i] for i, r in responses(out / k).items()) / evaluated, 3)
                                for k in settings if k != "baseline"},
        "ratio": round(seconds["baseline"] / seconds[first], 3),
    }
    return result


if __name__ == "__main__":
    main()
