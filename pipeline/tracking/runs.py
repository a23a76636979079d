"""MLflow as the system of record: runs, flattened params, per-step metrics, artifacts, tags.

A stage run nests under the pipeline's parent run when `TAPO_MLFLOW_PARENT_RUN` names one
(the orchestration flow sets it). When `TAPO_MLFLOW_STAGE_RUN` names a run, the stage flow has
already opened the stage's run (nested, tagged with its DVC input hashes) and `tracked_run`
logs into that one instead of opening another: one run per stage, whoever opens it. The git
commit is recorded as a tag on every run.

Killed runs do not stay RUNNING: every run is tagged with its owner process (`tapo.owner`:
host, pid and start time), and whenever a run is opened, the RUNNING runs of the experiment whose
owner on this host is gone (killed, even by SIGKILL, before it could end them) are marked KILLED
(`mark_abandoned_runs`). A stage interrupted by a signal marks its own run KILLED on the way out.

A resumed training is a run of its own, never the killed attempt's run reopened: MLflow can neither delete a
metric's points nor rewind a run, so reopening it would log every step the killed attempt ran past its checkpoint
twice, and would finish it under the parent of the `dvc repro` that was killed. The resumed attempt's run (under
the parent of the invocation that resumes) gets the steps before its checkpoint from the run's history
(`MetricHistory.log_earlier_steps`) and logs the rest itself, so it holds each step once; the killed attempt's
run stays as it ended (KILLED), with what it logged. The two name each other (`RESUMED_FROM_TAG`,
`RESUMED_BY_TAG`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import psutil
from mlflow.entities import Metric, RunStatus
from mlflow.exceptions import MlflowException

from pipeline.config.run import RunSection
from pipeline.paths import REPO_ROOT

PARENT_ENV = "TAPO_MLFLOW_PARENT_RUN"
STAGE_RUN_ENV = "TAPO_MLFLOW_STAGE_RUN"
MAX_PARAM_LEN = 500
DVC_TAG_PREFIX = "dvc.dep."  # one tag per DVC input of a run: dvc.dep.<path> = its md5
OWNER_TAG = "tapo.owner"  # '<host>:<pid>:<start time>' of the process that keeps the run open
LABEL_TAG = "tapo.label"  # on an ad-hoc stage run: its label (flows.outputs), so it never stands for the pipeline's
KILLED = RunStatus.to_string(RunStatus.KILLED)
RESUMED_FROM_TAG = "tapo.resumed_from"  # on a resumed attempt's run: the run that saved its checkpoint
RESUMED_AT_TAG = "tapo.resumed_at_step"  # ... and the step it continues from
RESUMED_BY_TAG = "tapo.resumed_by"  # on that earlier run: the run that continued it
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
# MLflow 3 opens an experiment of this kind on its runs table; untagged, it guesses GenAI and opens on traces.
CLASSIC_ML = "custom_model_development"


def open_experiment(run_cfg: RunSection) -> str:
    """The id of experiment `run.experiment` (created if needed), tagged as a classic ML experiment unless a
    kind was set by hand."""
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    experiment = mlflow.set_experiment(run_cfg.experiment)
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        mlflow.MlflowClient(run_cfg.tracking_uri).set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG,
                                                                      CLASSIC_ML)
    return experiment.experiment_id


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner(pid: int | None = None) -> str:
    """`tapo.owner` of this process (or `pid`): '<host>:<pid>:<start ticks>', the form of the
    `dvc_invocation` tag, so a plain `dvc repro`'s parent run is owned by that dvc process."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid) or 'unknown'}"


def _owner_gone(value: str) -> bool:
    """True when `value` names a process on this host that no longer runs (pid gone, reused, or a zombie)."""
    host, _, rest = value.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or started == "unknown" or not Path("/proc/self").exists():
        return False  # another machine's run, or no way to tell: not ours to judge
    if _start_ticks(int(pid)) != started:
        return True
    try:
        return psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def mark_abandoned_runs(client: mlflow.MlflowClient, experiment_id: str) -> list[str]:
    """Mark KILLED the experiment's RUNNING runs whose owner process on this host is gone; their ids."""
    running = client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000)
    ended = []
    for run in running:
        value = run.data.tags.get(OWNER_TAG)
        if value and _owner_gone(value):
            client.set_tag(run.info.run_id, "tapo.ended_by", f"owner process {value} gone")
            client.set_terminated(run.info.run_id, KILLED)
            ended.append(run.info.run_id)
    if ended:
        print(f"tracking: marked {len(ended)} run(s) KILLED whose process is gone: {ended}")
    return ended


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"train": {"optimizer": {"lr": 1e-6}}} -> {"train.optimizer.lr": "1e-06"} (MLflow params are flat strings)."""
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
def tracked_run(run_cfg: RunSection, stage: str, params: Mapping[str, Any], *, resumed_from: str | None = None,
                resumed_at: int = 0, tags: Mapping[str, str] | None = None) -> Iterator[mlflow.ActiveRun]:
    """Start an MLflow run for one stage, or adopt the flow's stage run if any. A resumed training names the
    run that saved its checkpoint (`resumed_from`, at step `resumed_at`); its own run is new all the same."""
    experiment_id = open_experiment(run_cfg)
    adopted = os.environ.get(STAGE_RUN_ENV)
    parent = os.environ.get(PARENT_ENV)
    all_tags = {"stage": stage, "git_commit": git_commit(), **(tags or {})}
    if resumed_from:
        all_tags |= {RESUMED_FROM_TAG: resumed_from, RESUMED_AT_TAG: str(resumed_at)}
    if parent and not adopted:
        all_tags["mlflow.parentRunId"] = parent
    if not adopted:  # an adopted run's owner is the flow that opened it
        all_tags[OWNER_TAG] = owner()
        mark_abandoned_runs(mlflow.MlflowClient(run_cfg.tracking_uri), experiment_id)
    with mlflow.start_run(run_id=adopted, run_name=None if adopted else stage, tags=all_tags) as active:
        mlflow.log_params(flatten(params))
        if resumed_from:
            link_resumed(run_cfg, resumed_from, active.info.run_id)
        try:
            yield active
        except (KeyboardInterrupt, SystemExit):  # a signal (see flows.common.stage_process), not a failure
            mlflow.end_run(KILLED)
            raise


def link_resumed(run_cfg: RunSection, earlier: str, run_id: str) -> None:
    """Tag the run a resumed attempt continues with the run that continues it (if the store still has it: the
    tracking URI may have changed between the two)."""
    try:
        mlflow.MlflowClient(run_cfg.tracking_uri).set_tag(earlier, RESUMED_BY_TAG, run_id)
    except MlflowException as err:
        print(f"tracking: the run {earlier} this one resumes is not in {run_cfg.tracking_uri} ({err.error_code})")


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    clean = {k: float(v) for k, v in metrics.items()}
    mlflow.log_metrics(clean, step=step)


def log_metric_rows(rows: Sequence[Mapping[str, float]]) -> None:
    """Rows of `{"step": n, metric: value, ...}` into the active run, each at its step, in batches."""
    now = int(time.time() * 1000)
    metrics = [Metric(key, float(value), now, int(row["step"])) for row in rows for key, value in row.items()
               if key != "step"]
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("metric rows are logged into the active MLflow run, and none is active")
    mlflow.MlflowClient().log_batch(run.info.run_id, metrics=metrics)


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
