"""What the train run records in MLflow besides metrics: sample tables.

(The hash of each input, `dvc.dep.<path>`, is DVC's, tagged by the stage flow that opens the run:
`flows/tracking.py`; the library computes none of its own.)

* `log_samples`: a few trajectories of a step (question, response, reward terms, tool calls,
  finish reason) as an MLflow table, `samples/step-NNNNNN.json`, to read what the policy writes
  as it trains. Picked without randomness, so logging never changes a resumed run's samples.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import mlflow

from pipeline.types import ScoredGroup

SAMPLES_DIR = "samples"


def pick_samples(groups: Sequence[ScoredGroup], n: int) -> list[tuple[ScoredGroup, int]]:
    """Up to `n` (group, index) pairs, round-robin: trajectory 0 of each group, then 1, and so on."""
    longest = max((len(g.group.trajectories) for g in groups), default=0)
    order = [(g, i) for i in range(longest) for g in groups if i < len(g.group.trajectories)]
    return order[:n]


def sample_table(step: int, groups: Sequence[ScoredGroup], kept: Sequence[ScoredGroup], n: int) -> dict[str, list[Any]]:
    """Column -> values for `n` sampled trajectories of one step (`kept`: the groups trained on)."""
    kept_ids = {id(g) for g in kept}
    rows = []
    for scored, i in pick_samples(groups, n):
        problem, trajectory, reward = scored.group.problem, scored.group.trajectories[i], scored.rewards[i]
        calls = [{"tool": c.tool, "input": c.input, "output": c.result.output, "status": c.result.status}
                 for c in trajectory.tool_calls]
        rows.append({
            "step": step, "problem_id": problem.id, "source": problem.source, "question": problem.question,
            "gold": json.dumps(list(problem.answers)), "response": trajectory.text,
            "finish_reason": trajectory.finish_reason, "n_tool_calls": len(calls), "tool_calls": json.dumps(calls),
            "predicted": reward.predicted or "", "format_ok": reward.format_ok, "accuracy": reward.accuracy,
            "format": reward.format, "length": reward.length, "code_penalty": reward.code_penalty,
            "entropy": reward.entropy, "total": reward.total, "kept": id(scored) in kept_ids,
        })
    return {column: [row[column] for row in rows] for column in (rows[0] if rows else {})}


def log_samples(run_id: str, step: int, groups: Sequence[ScoredGroup], kept: Sequence[ScoredGroup], n: int) -> None:
    """Log the step's sample table into run `run_id`, once.

    `mlflow.log_table` appends to an existing file, so a step a killed run already logged (and
    its resumption trains again, with the same samples) is not logged a second time.
    """
    table = sample_table(step, groups, kept, n)
    artifact_file = f"{SAMPLES_DIR}/step-{step:06d}.json"
    if not table or artifact_file in {a.path for a in mlflow.MlflowClient().list_artifacts(run_id, SAMPLES_DIR)}:
        return
    mlflow.log_table(table, artifact_file=artifact_file, run_id=run_id)
