"""The headline numbers: training's final figures averaged over the last quarter of its steps (not one noisy
batch), its headline and last line stating the same; evaluation's pooled, per benchmark and per type when there are
several; the headline files' keys short and unique across files, so DVC's tables fit a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from pipeline.tracking.headline import (eval_headline, final_line, last_quarter, train_final, train_headline,
                                        write_train_headline)


@pytest.mark.parametrize(("steps", "averaged"), [(1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (40, 10)])
def test_the_last_quarter_of_the_steps(steps: int, averaged: int) -> None:
    assert last_quarter(steps) == averaged


def test_training_headline_averages_the_last_quarter() -> None:
    rows = [{"step": s, "reward/mean": float(s), "reward/accuracy": s / 10, "reward/format_error_rate": 0.5,
             "rollout/calls_per_traj/code": 1.0 + s, "train/grad_norm": 9.0} for s in reversed(range(8))]
    final = train_final(rows)
    assert final == {"reward": 6.5, "accuracy": pytest.approx(0.65), "format_error_rate": 0.5,
                     "calls_per_traj/code": 7.5, "steps": 8.0, "averaged_steps": 2.0}
    assert train_headline(final) == {"reward": 6.5}  # the final reward, not the last step's 7.0
    assert final_line(final) == "final (mean of the last 2 of 8 steps): reward 6.500, accuracy 0.650, format errors 0.500"


def test_the_final_figures_the_headline_and_mlflow_state_one_number(tmp_path: Path) -> None:
    """The stage's files and its MLflow run carry the same final reward: the last quarter's mean."""
    from pipeline.config.run import RunSection

    rows = [{"step": s, "reward/mean": [0.1, 0.2, 0.3, 0.4, 0.5, 0.9, 0.2, 0.625][s]} for s in range(8)]
    run_cfg = RunSection(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    client = mlflow.MlflowClient(run_cfg.tracking_uri)
    run_id = client.create_run(client.create_experiment("h")).info.run_id
    final = write_train_headline(tmp_path, rows, ["reward/mean"], run_cfg, run_id)
    assert final["reward"] == pytest.approx(0.4125)
    assert json.loads((tmp_path / "headline" / "train.json").read_text()) == {"reward": final["reward"]}
    assert json.loads((tmp_path / "train_final.json").read_text()) == final
    assert client.get_run(run_id).data.metrics["headline/reward"] == final["reward"]
    assert (tmp_path / "train_curve.png").stat().st_size > 1000


def test_evaluation_headline_per_benchmark_and_type_only_when_several() -> None:
    metrics = {"all/accuracy": 0.5, "all/format_error_rate": 0.1, "all/tool_failure_rate": 0.0,
               "all/calls_per_rollout/code": 1.0, "all/calls_per_rollout/search": 0.5, "n_problems": 30.0,
               "gsm8k/accuracy": 0.8, "gsm8k/n_samples": 10.0, "math500/accuracy": 0.2, "math500/n_samples": 10.0,
               "nq/accuracy": 0.5, "nq/n_samples": 10.0}
    one = eval_headline(metrics, {"gsm8k": "math"})
    assert one == {"accuracy": 0.5, "format_error_rate": 0.1, "tool_failure_rate": 0.0, "calls_per_rollout/code": 1.0,
                   "calls_per_rollout/search": 0.5, "n_problems": 30.0}
    several = eval_headline(metrics, {"gsm8k": "math", "math500": "math", "nq": "fact"})
    assert set(several) - set(one) == {
        "accuracy/gsm8k", "accuracy/math500", "accuracy/nq", "accuracy/math", "accuracy/fact"}
    assert several["accuracy/math"] == pytest.approx(0.5) and several["accuracy/fact"] == 0.5
