"""MLflow as the system of record: runs, flattened params, per-step metrics, artifacts, tags.

A stage run nests under the pipeline's parent run when `TAPO_MLFLOW_PARENT_RUN` names one
(the orchestration flow sets it). The git commit is recorded as a tag on every run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow

from pipeline.config.run import RunSection
from pipeline.paths import REPO_ROOT

PARENT_ENV = "TAPO_MLFLOW_PARENT_RUN"
MAX_PARAM_LEN = 500


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 1e-6}} -> {"train.lr": "1e-06"} (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten(value, name + ".")
        else:
            flat[name] = str(value)[:MAX_PARAM_LEN]
    return flat


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


@contextmanager
def tracked_run(run_cfg: RunSection, stage: str, params: Mapping[str, Any], *, run_id: str | None = None,
                tags: Mapping[str, str] | None = None) -> Iterator[mlflow.ActiveRun]:
    """Start (or resume, given `run_id`) an MLflow run for one stage."""
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    parent = os.environ.get(PARENT_ENV)
    all_tags = {"stage": stage, "git_commit": git_commit(), **(tags or {})}
    if parent and run_id is None:
        all_tags["mlflow.parentRunId"] = parent
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else stage, tags=all_tags) as active:
        if run_id is None:
            mlflow.log_params(flatten(params))
        yield active


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    clean = {k: float(v) for k, v in metrics.items()}
    mlflow.log_metrics(clean, step=step)


def log_dir(path: Path, artifact_path: str) -> None:
    mlflow.log_artifacts(str(path), artifact_path=artifact_path)
