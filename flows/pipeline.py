"""The whole pipeline as one Prefect flow under one MLflow parent run.

    python -m flows.pipeline --params params.yaml   # every stage as a Prefect subflow, in this process
    python -m flows.pipeline --dvc                  # `dvc repro` (skips up-to-date stages) under the parent run

The parent run is created with the MLflow client (not `mlflow.start_run`), so the stage runs the
library opens with the fluent API are not blocked by an active run; they nest under it through
`TAPO_MLFLOW_PARENT_RUN`, which also reaches the stage processes `dvc repro` starts. The parent
is tagged with the git commit and the DVC hash of every stage input recorded in `dvc.lock`
(read when the run starts in-process; after `dvc repro`, which rewrites it, in dvc mode).
Stages whose library code opens no MLflow run (prepare-model, curate, build-index) get a
nested run here, with their report as params, so every stage has one nested run in-process.
"""

from __future__ import annotations

import argparse
import os
from collections import deque
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.entities import Param, RunStatus
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.build_index import build_index_flow
from flows.common import load_or_exit
from flows.curate import curate_flow
from flows.evaluate import evaluate_flow
from flows.prepare_model import prepare_model_flow
from flows.sft import sft_flow
from flows.train import train_flow
from pipeline.config import DEFAULT_PARAMS
from pipeline.config.run import RunSection
from pipeline.tracking import PARENT_ENV, flatten, git_commit

STAGES: tuple[tuple[str, Callable[[str], Any]], ...] = (
    ("prepare-model", prepare_model_flow), ("curate", curate_flow), ("build-index", build_index_flow),
    ("sft", sft_flow), ("train", train_flow), ("evaluate", evaluate_flow))
SELF_TRACKED = {"sft", "train", "evaluate"}  # their library code opens a run that nests under the parent
DVC_TAG_PREFIX = "dvc.dep."


class LockFileError(ValueError):
    """A dvc.lock that is not the YAML DVC writes."""


def dvc_input_hashes(lock_path: Path) -> dict[str, str]:
    """{dep path: md5} over every stage's deps in dvc.lock; {} when there is no lock file yet."""
    if not lock_path.is_file():
        return {}
    try:
        lock = yaml.safe_load(lock_path.read_text()) or {}
    except yaml.YAMLError as err:
        raise LockFileError(f"{lock_path}: not valid YAML: {err}") from None
    stages = lock.get("stages") if isinstance(lock, dict) else None
    if not isinstance(stages, dict):
        raise LockFileError(f"{lock_path}: no 'stages' mapping (is it a DVC 2+ lock file?)")
    hashes: dict[str, str] = {}
    for name, stage in stages.items():
        for dep in (stage or {}).get("deps", []):
            if "path" not in dep or "md5" not in dep:
                raise LockFileError(f"{lock_path}: stage {name!r} has a dep without 'path' and 'md5': {dep}")
            hashes[dep["path"]] = dep["md5"]
    return hashes


def lineage_tags(lock_path: Path) -> dict[str, str]:
    tags = {"git_commit": git_commit()}
    tags |= {f"{DVC_TAG_PREFIX}{path}": md5 for path, md5 in dvc_input_hashes(lock_path).items()}
    return tags


@contextmanager
def parent_run(run_cfg: RunSection, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> Iterator[str]:
    """An MLflow run whose id the stages see in TAPO_MLFLOW_PARENT_RUN; FAILED if the body raises."""
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    experiment = mlflow.set_experiment(run_cfg.experiment)
    client = MlflowClient(run_cfg.tracking_uri)
    run_id = client.create_run(experiment.experiment_id, run_name=name,
                               tags={"stage": "pipeline", **tags}).info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(params).items()])
    previous = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = run_id
    status = RunStatus.to_string(RunStatus.FAILED)
    try:
        yield run_id
        status = RunStatus.to_string(RunStatus.FINISHED)
    finally:
        if previous is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = previous
        client.set_terminated(run_id, status)


def nested_stage_run(run_cfg: RunSection, parent_id: str, stage: str, report: Any) -> None:
    """Record a stage that opens no MLflow run itself: its report as params, numbers also as metrics."""
    client = MlflowClient(run_cfg.tracking_uri)
    experiment_id = client.get_run(parent_id).info.experiment_id
    run = client.create_run(experiment_id, run_name=stage,
                            tags={"stage": stage, "git_commit": git_commit(), "mlflow.parentRunId": parent_id})
    values = report if isinstance(report, Mapping) else {"output": report}
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in flatten(values).items()])
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            client.log_metric(run.info.run_id, key, float(value))
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))


@task(cache_policy=NO_CACHE, retries=0)
def dvc_repro(workdir: str, args: tuple[str, ...]) -> None:
    """`dvc <args>` in `workdir`, its output streamed to the flow log. Not retried: stages are not I/O."""
    local = Path(sys.executable).with_name("dvc")
    dvc = str(local) if local.is_file() else "dvc"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    logger = get_run_logger()
    tail: deque[str] = deque(maxlen=60)
    with subprocess.Popen([dvc, *args], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout or ():
            tail.append(line.rstrip())
            logger.info(line.rstrip())
    if proc.returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args)} failed in {workdir} (exit {proc.returncode}):\n" + "\n".join(tail))


def run_stages(params: str, run_cfg: RunSection, parent_id: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, stage_flow in STAGES:
        results[name] = stage_flow(params)
        if name not in SELF_TRACKED:
            nested_stage_run(run_cfg, parent_id, name, results[name])
    return results


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: str = str(DEFAULT_PARAMS), use_dvc: bool = False, workdir: str = ".",
                  dvc_args: tuple[str, ...] = ("repro",)) -> dict[str, Any]:
    """All stages in order under one MLflow parent run; returns each stage's result (in-process)."""
    cfg = load_or_exit(Path(workdir) / params if use_dvc else params)
    lock = Path(workdir) / "dvc.lock"
    tags = {"mode": "dvc" if use_dvc else "flow", "prefect_flow_run_id": str(flow_run.id or "")}
    if not use_dvc:
        tags |= lineage_tags(lock)
    with parent_run(cfg.run, "pipeline", cfg.model_dump(), tags) as parent_id:
        print(f"MLflow parent run {parent_id} in experiment {cfg.run.experiment!r}")
        if not use_dvc:
            return run_stages(params, cfg.run, parent_id)
        dvc_repro(workdir, tuple(dvc_args))
        client = MlflowClient(cfg.run.tracking_uri)
        for key, value in lineage_tags(lock).items():  # the lock dvc repro just wrote: what was run
            client.set_tag(parent_id, key, value)
        return {"parent_run_id": parent_id, "dvc_inputs": len(dvc_input_hashes(lock))}


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the whole pipeline under one MLflow parent run.")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS), help="params file (default: params.yaml)")
    parser.add_argument("--dvc", action="store_true", help="run `dvc repro` (only stages whose inputs changed)")
    args = parser.parse_args()
    load_or_exit(args.params)  # fail on a bad params file before Prefect starts
    try:
        pipeline_flow(args.params, use_dvc=args.dvc)
    except LockFileError as err:
        print(f"pipeline: {err}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
