"""What logging rollouts as MLflow traces costs (`pipeline.tracking.traces`, bounded by `run.traces`): bytes and
seconds per training step and per evaluated problem, beside what the same step or problem logs without traces.

    python -m benchmarks.trace_cost [--steps 6] [--problems 24] [--quick]

Into a scratch SQLite store (the default `run.tracking_uri`'s kind), as the stages log: a training step logs its
metrics row (the keys one step of the main job logs) and, with traces, `run.traces.train_groups_per_step` groups of
`rollout.group_size` trajectories; an evaluation logs each problem's record (the samples file and table) and, with
traces, one trace a problem. The trajectories have the main job's shape at the params' limits (two turns of
`rollout.max_policy_tokens` tokens, ~4 characters a token, and one tool call answered with
`rollout.max_tool_output_chars`), so the figures are an upper bound for the default run. Bytes: what the store's
database and artifact folder grew by. Seconds: how long the caller is held, as the stages are: the logging calls,
which queue the traces, and the one wait for them at the stage's end, shared over the steps or problems (MLflow's
own thread writes them meanwhile, beside the stage's work). The last line is one JSON object: per step and per problem, bytes and seconds without and with traces, and
"ratio" = (bytes of a step with traces) / (bytes without); "time_ratio" likewise for seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks import harness

QUICK = {"steps": 2, "problems": 4}


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="python -m benchmarks.trace_cost", description=__doc__.splitlines()[0])
    built.add_argument("--steps", type=int, default=6, help="training steps logged")
    built.add_argument("--problems", type=int, default=24, help="evaluated problems logged")
    return built


if __name__ == "__main__":
    harness.parse(parser(), None, QUICK)

import mlflow  # noqa: E402  (after the command line: see `parser`)
import numpy as np  # noqa: E402

from pipeline.config import RunConfig  # noqa: E402
from pipeline.tracking.traces import Score, finish_traces, log_traces, problem_trace, step_traces  # noqa: E402
from pipeline.types import (Collected, Group, Problem, RewardBreakdown, ScoredGroup, ToolCall,  # noqa: E402
                            ToolResult, Trajectory)

CHARS_PER_TOKEN = 4
METRICS_PER_STEP = 120  # about what one step of the main job logs (reward, rollout, train, time, tool choice keys)


def trajectory(rng: random.Random, cfg: RunConfig, problem: Problem) -> Trajectory:
    """Two turns of the policy's longest text around one tool call answered at the output limit."""
    turn = cfg.rollout.max_policy_tokens * CHARS_PER_TOKEN // 2
    texts = ("".join(rng.choice("abcdefgh <>/") for _ in range(turn)) for _ in range(2))
    first, last = next(texts), next(texts)
    output = "".join(rng.choice("0123456789 \n") for _ in range(cfg.rollout.max_tool_output_chars))
    call = ToolCall("code", "print(" + "1 + " * 20 + "1)", ToolResult(output, True, "ok", None, rng.uniform(0.05, 2.0)),
                    (0, 10), (10, 20))
    n = cfg.rollout.max_policy_tokens
    return Trajectory(problem.id, tuple(range(64)), tuple(range(n)), (1,) * n, (-0.5,) * n, (call,), "answer",
                      first + output + last, 2, segments=(first, last))


def problems(n: int) -> list[Problem]:
    return [Problem(f"p{i}", f"What is {i} + {i}? " * 4, (str(2 * i),), "calculator", "calculator", "test")
            for i in range(n)]


def scored(rng: random.Random, cfg: RunConfig, problem: Problem) -> ScoredGroup:
    trajs = tuple(trajectory(rng, cfg, problem) for _ in range(cfg.rollout.group_size))
    rewards = tuple(RewardBreakdown(True, float(i % 2), 0.0, 0.0, total=float(i % 2), predicted="4")
                    for i in range(len(trajs)))
    return ScoredGroup(Group(problem, trajs), rewards)


def store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def timed(root: Path, work) -> tuple[int, float]:
    """(bytes the store grew by, seconds) of `work()`."""
    before, started = store_bytes(root), time.perf_counter()
    work()
    return store_bytes(root) - before, time.perf_counter() - started


def held(root: Path, calls: list) -> list[tuple[int, float]]:
    """Each of `calls` (logging traces without waiting, as the stages do) and then the stage's one wait at its end
    (`finish_traces`), as (bytes the store grew by, seconds the caller was held) per call: the wait and the bytes,
    which land when MLflow's writer thread gets to them, shared evenly. MLflow's thread writes beside the caller."""
    before, seconds = store_bytes(root), 0.0
    for call in calls:
        started = time.perf_counter()
        call()
        seconds += time.perf_counter() - started
    started = time.perf_counter()
    finish_traces()
    seconds += time.perf_counter() - started
    grown = store_bytes(root) - before
    return [(round(grown / len(calls)), seconds / len(calls))] if calls else []


def measure_steps(cfg: RunConfig, root: Path, run_id: str, steps: int) -> dict[str, float]:
    rng = random.Random(0)
    plain: list[tuple[int, float]] = []
    queued: list = []
    for step in range(steps):
        row = {f"metric/{i}": rng.random() for i in range(METRICS_PER_STEP)}
        plain.append(timed(root, lambda row=row, step=step: mlflow.log_metrics(row, step=step)))
        groups = [scored(rng, cfg, p) for p in problems(cfg.train.sampling.prompts_per_step)]
        collected = Collected(groups[:1], groups, {}, groups[1:])
        traces = step_traces(cfg.run.traces, step, collected, lambda gs: [np.zeros(len(g.rewards)) for g in gs])
        queued.append(lambda traces=traces: log_traces(traces, run_id, wait=False))
    return summary(plain, held(root, queued), "step")


def measure_problems(cfg: RunConfig, root: Path, run_id: str, count: int) -> dict[str, float]:
    rng = random.Random(1)
    plain: list[tuple[int, float]] = []
    queued: list = []
    for problem in problems(count):
        traj = trajectory(rng, cfg, problem)
        record = {"id": problem.id, "sample": 0, "question": problem.question, "response": traj.text, "score": 1.0,
                  "reward": 1.0, "format_ok": True, "predicted": "4",
                  "tool_calls": [{"tool": c.tool, "input": c.input, "output": c.result.output} for c in traj.tool_calls]}

        def samples(record=record) -> None:  # the evaluation's own record of a problem: its line and its table row
            path = root / "scratch" / f"{record['id']}.jsonl"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(record) + "\n")
            mlflow.log_artifact(str(path), "evaluation")
            mlflow.log_table({k: [str(v)] for k, v in record.items()}, artifact_file=f"evaluation/{record['id']}.json")
            path.unlink()

        plain.append(timed(root, samples))
        trace = problem_trace("calculator", problem, [traj], [Score(1.0, 1.0, True, "4")])
        queued.append(lambda trace=trace: log_traces([trace], run_id, wait=False))
    return summary(plain, held(root, queued), "problem")


def summary(plain: list[tuple[int, float]], traced: list[tuple[int, float]], unit: str) -> dict[str, float]:
    bytes_without = sum(b for b, _ in plain) / len(plain)
    seconds_without = sum(s for _, s in plain) / len(plain)
    bytes_traces = sum(b for b, _ in traced) / len(traced)
    seconds_traces = sum(s for _, s in traced) / len(traced)
    return {f"bytes_per_{unit}_without": round(bytes_without), f"bytes_per_{unit}_traces": round(bytes_traces),
            f"seconds_per_{unit}_without": round(seconds_without, 4),
            f"seconds_per_{unit}_traces": round(seconds_traces, 4),
            f"{unit}_ratio": round((bytes_without + bytes_traces) / max(bytes_without, 1), 2),
            f"{unit}_time_ratio": round((seconds_without + seconds_traces) / max(seconds_without, 1e-9), 2)}


def main(argv: list[str] | None = None) -> None:
    args = harness.parse(parser(), argv, QUICK)
    cfg = harness.derive()
    with tempfile.TemporaryDirectory(prefix="trace-cost-") as scratch:
        root = Path(scratch)
        mlflow.set_tracking_uri(f"sqlite:///{root / 'mlruns.db'}")
        experiment = mlflow.create_experiment("trace-cost", artifact_location=(root / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            steps = measure_steps(cfg, root, run.info.run_id, args.steps)
            evaluation = measure_problems(cfg, root, run.info.run_id, args.problems)
    result = {"groups_per_step": cfg.run.traces.train_groups_per_step, "group_size": cfg.rollout.group_size,
              **steps, **evaluation, "ratio": steps["step_ratio"], "time_ratio": steps["step_time_ratio"]}
    print(f"a step: {steps['bytes_per_step_without']} B and {steps['seconds_per_step_without']} s without traces, "
          f"+{steps['bytes_per_step_traces']} B and +{steps['seconds_per_step_traces']} s with "
          f"{cfg.run.traces.train_groups_per_step} groups of {cfg.rollout.group_size} traced")
    print(f"a problem: {evaluation['bytes_per_problem_without']} B and {evaluation['seconds_per_problem_without']} s "
          f"without, +{evaluation['bytes_per_problem_traces']} B and +{evaluation['seconds_per_problem_traces']} s "
          "with its trace")
    harness.last_line(result, quick=args.quick)


if __name__ == "__main__":
    main()
