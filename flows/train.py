"""Stage train: RL with tools (DAPO by default) from the base or SFT model.

In this process, or under `distributed.enabled` on the ranks the flow launches (`flows.ranks`: the placement
comes from params; the services start once, here, and every rank is given their URLs).

The trainer logs into the stage's MLflow run (a resumed training into the run its checkpoint
names). Afterwards the checkpoints this run saved are logged into it too (also those saved before a kill,
when the resume had nothing left to train): every checkpoint's metadata and the last one whole
(weights, optimiser, RNG), so training can resume elsewhere.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit, run_stage, tools_needed
from flows.ranks import stage_placement, train_on_ranks
from flows.services import running_services
from flows.tracking import stage_run
from pipeline.trainer.checkpoint import is_complete, latest_checkpoint
from pipeline.config import RunConfig
from pipeline.distributed.launch import Placement
from pipeline.tracking.registry import quiet_progress_unless_tty
from pipeline.tracking.runs import log_checkpoints
from pipeline.train import run as train


@task(cache_policy=NO_CACHE)
def train_task(cfg: RunConfig, urls: dict, resume: bool) -> dict:
    return train(cfg, urls, resume=resume)


@task(cache_policy=NO_CACHE)
def ranks_task(where: Placement, params: str, urls: dict, resume: bool) -> dict:
    return train_on_ranks(where, params, urls, resume, get_run_logger().info)


def resumed_run_id(cfg: RunConfig) -> str | None:
    """The MLflow run the latest checkpoint was saved by, if it still exists at the tracking URI."""
    latest = latest_checkpoint(Path(cfg.train.checkpoint_dir))
    state = latest / "state.json" if latest else None
    if state is None or not state.is_file():
        return None
    run_id = json.loads(state.read_text()).get("mlflow_run_id")
    try:
        return MlflowClient(cfg.run.tracking_uri).get_run(run_id).info.run_id if run_id else None
    except MlflowException:
        return None


def checkpoints_of_run(cfg: RunConfig, run_id: str, started: float) -> list[Path]:
    """The complete checkpoints this run saved: written since `started`, or (a resume that had nothing left
    to train) saved by run `run_id` before it was killed. Not those of an earlier training."""
    root = Path(cfg.train.checkpoint_dir) / "checkpoints"
    return sorted(p for p in root.glob("step-??????") if is_complete(p)
                  and (p.stat().st_mtime >= started or _saved_by(p) == run_id))


def _saved_by(checkpoint: Path) -> str | None:
    try:
        return json.loads((checkpoint / "state.json").read_text()).get("mlflow_run_id")
    except (OSError, ValueError):
        return None


@flow(name="train", log_prints=True)
def train_flow(params: str = "params.yaml", resume: bool = False) -> dict:
    cfg = load_or_exit(params)
    tools = tools_needed(cfg.train.train_file)
    where = stage_placement(cfg, tools)  # None: train in this process
    started = time.time() - 1.0  # file times may be rounded down
    with stage_run(cfg, "train", run_id=resumed_run_id(cfg) if resume else None) as run_id:
        with running_services(cfg, tools, params, ranks=where.local_ranks if where else 1) as urls:
            metrics = ranks_task(where, params, urls, resume) if where else train_task(cfg, urls, resume)
        if run_id is not None:
            quiet_progress_unless_tty()
            logged = log_checkpoints(cfg.run, run_id, checkpoints_of_run(cfg, run_id, started))
            print(f"checkpoints logged to MLflow run {run_id}: {logged}")
    print(f"final step: reward {metrics.get('reward/mean')}, accuracy {metrics.get('reward/accuracy')}")
    return metrics


if __name__ == "__main__":
    run_stage(train_flow, "Train the policy with tools.", resume=True)
