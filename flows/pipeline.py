"""The whole pipeline as one Prefect flow under one MLflow parent run.

    python -m flows.pipeline --params params.yaml   # every stage as a Prefect subflow, in this process
    python -m flows.pipeline --dvc                  # `dvc repro` (skips up-to-date stages) under the parent run

The parent run is named in `TAPO_MLFLOW_PARENT_RUN`, which also reaches the stage processes
`dvc repro` starts; every stage flow opens its one nested run under it (flows/tracking.py),
tagged with the DVC hashes of that stage's inputs. The parent is tagged with the git commit
and the DVC hash of every stage input recorded in `dvc.lock` (read when the run starts
in-process; after `dvc repro`, which rewrites it, in dvc mode). In dvc mode with nothing to do
(`dvc status` finds every stage up to date) no parent run is opened: the flow run records that in a
markdown artifact instead of leaving an empty MLflow run behind.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("pipeline")

import json
import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.build_index import build_index_flow
from flows.common import load_or_exit
from flows.dvc_run import run_dvc
from flows.summary import publish
from flows.curate import curate_flow
from flows.evaluate import evaluate_flow
from flows.prepare_model import prepare_model_flow
from flows.sft import sft_flow
from flows.train import train_flow
from flows.tracking import dvc_input_hashes, lineage_tags, parent_run
from pipeline.config import DEFAULT_PARAMS

# Every stage writes where its params say (out="."): the stages of one pipeline read each other's outputs, in
# dvc.yaml's order (curate's unanswerable filter searches the index build-index writes).
STAGES: tuple[tuple[str, Callable[[str], Any]], ...] = (
    ("prepare-model", lambda params: prepare_model_flow(params, out=".")),
    ("build-index", lambda params: build_index_flow(params, out=".")),
    ("curate", lambda params: curate_flow(params, out=".")),
    ("sft", lambda params: sft_flow(params, out=".")), ("train", lambda params: train_flow(params, out=".")),
    ("evaluate", lambda params: evaluate_flow(params, out=".")))


def dvc_command() -> tuple[str, dict[str, str]]:
    """The dvc executable beside this Python (else on PATH) and the environment to run it in."""
    local = Path(sys.executable).with_name("dvc")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return (str(local) if local.is_file() else "dvc"), env


def dvc_up_to_date(workdir: str) -> bool:
    """Whether `dvc repro` would run no stage (`dvc status` reports nothing changed)."""
    dvc, env = dvc_command()
    done = subprocess.run([dvc, "status", "--json"], cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"dvc status failed in {workdir} (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout or "{}") == {}


@task(cache_policy=NO_CACHE, retries=0)
def dvc_repro(workdir: str, args: tuple[str, ...]) -> None:
    """`dvc <args>` in `workdir`, its output streamed to the flow log. Not retried: stages are not I/O."""
    dvc, env = dvc_command()
    logger = get_run_logger()
    tail: deque[str] = deque(maxlen=60)

    def log(line: str) -> None:
        tail.append(line)
        logger.info(line)

    returncode = run_dvc([dvc, *args], cwd=workdir, env=env, on_line=log)  # stopped, it stops dvc's stage first
    if returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args)} failed in {workdir} (exit {returncode}):\n" + "\n".join(tail))


def run_stages(params: str) -> dict[str, Any]:
    return {name: stage_flow(params) for name, stage_flow in STAGES}


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: str = str(DEFAULT_PARAMS), use_dvc: bool = False, workdir: str = ".",
                  dvc_args: tuple[str, ...] = ("repro",)) -> dict[str, Any]:
    """All stages in order under one MLflow parent run; returns each stage's result (in-process)."""
    cfg = load_or_exit(Path(workdir) / params if use_dvc else params)
    if use_dvc and tuple(dvc_args) == ("repro",) and dvc_up_to_date(workdir):
        publish("pipeline", "pipeline: nothing to do", "`dvc status`: every stage is up to date; no stage ran and "
                "no MLflow run was opened.", cfg.run, None)
        print("every stage is up to date: nothing to run")
        return {"parent_run_id": None, "up_to_date": True}
    lock = Path(workdir) / "dvc.lock"
    tags = {"mode": "dvc" if use_dvc else "flow", "prefect_flow_run_id": str(flow_run.id or "")}
    if not use_dvc:
        tags |= lineage_tags(lock)
    # named after the flow run (Prefect's name for it, e.g. "crimson-fox"): the stage runs become <name>/<stage>
    with parent_run(cfg.run, str(flow_run.name or "pipeline"), cfg.model_dump(), tags) as parent_id:
        print(f"MLflow parent run {parent_id} in experiment {cfg.run.experiment!r}")
        if not use_dvc:
            return run_stages(params)
        dvc_repro(workdir, tuple(dvc_args))
        client = MlflowClient(cfg.run.tracking_uri)
        for key, value in lineage_tags(lock).items():  # the lock dvc repro just wrote: what was run
            client.set_tag(parent_id, key, value)
        return {"parent_run_id": parent_id, "dvc_inputs": len(dvc_input_hashes(lock)), "up_to_date": False}
