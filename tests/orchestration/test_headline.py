"""The headline numbers: training's averaged over the last quarter of its steps (not one noisy batch),
evaluation's pooled, per benchmark and per type when there are several."""

from __future__ import annotations

import pytest

from pipeline.tracking.headline import eval_headline, last_quarter, train_headline


@pytest.mark.parametrize(("steps", "averaged"), [(1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (40, 10)])
def test_the_last_quarter_of_the_steps(steps: int, averaged: int) -> None:
    assert last_quarter(steps) == averaged


def test_training_headline_averages_the_last_quarter() -> None:
    rows = [{"step": s, "reward/mean": float(s), "reward/accuracy": s / 10, "reward/format_error_rate": 0.5,
             "rollout/calls_per_traj/code": 1.0 + s, "train/grad_norm": 9.0} for s in reversed(range(8))]
    assert train_headline(rows) == {"reward": 6.5, "accuracy": pytest.approx(0.65), "format_error_rate": 0.5,
                                    "calls_per_traj/code": 7.5, "steps": 8.0, "averaged_steps": 2.0}


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
