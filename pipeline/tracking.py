"""MLflow as the system of record: runs, flattened params, per-step metrics, artifacts, tags.

A stage run nests under the pipeline's parent run when `TAPO_MLFLOW_PARENT_RUN` names one
(the orchestration flow sets it). When `TAPO_MLFLOW_STAGE_RUN` names a run, the stage flow has
already opened the stage's run (nested, tagged with its DVC input hashes) and `tracked_run`
logs into that one instead of opening another: one run per stage, whoever opens it. The git
commit is recorded as a tag on every run.
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
STAGE_RUN_ENV = "TAPO_MLFLOW_STAGE_RUN"
MAX_PARAM_LEN = 500
DVC_TAG_PREFIX = "dvc.dep."  # one tag per DVC input of a run: dvc.dep.<path> = its md5


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


def dvc_dep_tags(hashes: Mapping[str, str]) -> dict[str, str]:
    """{path: md5} -> the run tags naming each DVC input ({"dvc.dep.<path>": md5})."""
    return {f"{DVC_TAG_PREFIX}{path}": md5 for path, md5 in hashes.items()}


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


@contextmanager
def tracked_run(run_cfg: RunSection, stage: str, params: Mapping[str, Any], *, run_id: str | None = None,
                tags: Mapping[str, str] | None = None) -> Iterator[mlflow.ActiveRun]:
    """Start (or resume, given `run_id`) an MLflow run for one stage; adopt the flow's stage run if any."""
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    resumed = run_id is not None
    adopted = None if resumed else os.environ.get(STAGE_RUN_ENV)
    parent = os.environ.get(PARENT_ENV)
    all_tags = {"stage": stage, "git_commit": git_commit(), **(tags or {})}
    if parent and not resumed and not adopted:
        all_tags["mlflow.parentRunId"] = parent
    run_id = run_id or adopted
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else stage, tags=all_tags) as active:
        if not resumed:
            mlflow.log_params(flatten(params))
        yield active


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    clean = {k: float(v) for k, v in metrics.items()}
    mlflow.log_metrics(clean, step=step)


def log_dir(path: Path, artifact_path: str) -> None:
    mlflow.log_artifacts(str(path), artifact_path=artifact_path)


def log_checkpoints(run_cfg: RunSection, run_id: str, checkpoints: list[Path], artifact_path: str = "checkpoints",
                    *, full: int = 1) -> list[str]:
    """Log checkpoint directories into run `run_id` (which may have ended): the metadata of every one
    (its top-level JSON files: trainer state, model config), and the whole directory (weights,
    optimiser, RNG) of the last `full` ones, so training can resume from the tracking server
    without storing every step's weights twice. Returns the artifact folders written."""
    client = mlflow.MlflowClient(run_cfg.tracking_uri)
    ordered = sorted(checkpoints)
    for i, ckpt in enumerate(ordered):
        dest = f"{artifact_path}/{ckpt.name}"
        if i >= len(ordered) - full:
            client.log_artifacts(run_id, str(ckpt), dest)
        else:
            for meta in sorted(ckpt.glob("*.json")):
                client.log_artifact(run_id, str(meta), dest)
    return [f"{artifact_path}/{c.name}" for c in ordered]
