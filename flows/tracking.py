"""MLflow runs of the pipeline and its stages: one parent run per pipeline run, one nested run per stage.

Where the parent comes from:
* `python -m flows.pipeline` (in-process or `--dvc`) opens it and names it in
  `TAPO_MLFLOW_PARENT_RUN`, which reaches the stage processes `dvc repro` starts;
* a plain `dvc repro` / `dvc exp run` has no such variable: the first stage it runs creates a
  parent tagged with the invocation (`dvc_invocation`: host, pid and start time of the `dvc`
  process above the stage), and its later stages find it by that tag;
* a stage run alone (`python -m flows.curate`) has no parent.

`stage_run` opens the stage's run under that parent, named after the stage (`train`, `evaluate-sft`; an ad-hoc
run after what it ran too: `evaluate-step12`, tagged `tapo.label`), tagged with the git commit and the DVC
hash of each of the stage's file/directory inputs (`dvc.dep.<path>`, computed by DVC the way
`dvc.lock` records them, from DVC's hash cache, so it is cheap), and names it in
`TAPO_MLFLOW_STAGE_RUN`, where the library's `tracked_run` adopts it. When the stage succeeds its headline numbers
become the parent's metrics (`<stage>/<name>`), the columns of the runs table's shared `headline` view
(`pipeline.tracking.views`). A plain `dvc repro`'s parent is RUNNING, with no end time, while one of its stages runs,
and ends with each (FINISHED, FAILED or KILLED, the stages' end time): between two stages it says how the stages so
far ended. A data-parallel rank
other than 0 records nothing. A stage run is always new: a resumed training does not reopen the run of the
attempt that was killed (which stays KILLED under the parent of the `dvc repro` it ran in), so the parent of
the invocation that finishes the training holds the run that finished it (`pipeline.tracking.runs`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag

from flows.quiet import quiet_libraries
from pipeline.config import RunConfig
from pipeline.config.run import RunSection
from pipeline.tracking.runs import (LABEL_TAG, OWNER_TAG, PARENT_ENV, STAGE_RUN_ENV, dvc_dep_tags, flatten,
                                    git_commit, mark_abandoned_runs, open_experiment, owner)
from pipeline.tracking.views import experiment_url, share_headline_view, stage_headline

INVOCATION_TAG = "dvc_invocation"
UI_URL_ENV = "TAPO_MLFLOW_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:5000"
# MLflow 3.17's UI picks GenAI or "Model training" pages by a switch (the URL's `workflowType`, else the
# browser's last choice, GenAI at first), not by the experiment's kind tag: links ask for the runs table.
UI_MODE = "workflowType=machine_learning"
RUNNING, FINISHED, FAILED, KILLED = (RunStatus.to_string(s) for s in (
    RunStatus.RUNNING, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.KILLED))
CURVED_STAGES = ("train", "sft")  # stages whose runs chart per-step curves: no single-value metrics beside them


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
    tags |= dvc_dep_tags(dvc_input_hashes(lock_path))
    return tags


def stage_input_hashes(stage: str, root: Path | None = None) -> dict[str, str]:
    """{dep path: DVC md5} of the stage's file and directory deps in `root`'s dvc.yaml, as `dvc.lock`
    would record them for this run (the lock itself is written only after the stage). {} outside a
    DVC repository or for a stage dvc.yaml does not define; a missing dep is skipped."""
    root = Path(root or os.environ.get("DVC_ROOT") or ".")
    if not (root / ".dvc").is_dir() or not (root / "dvc.yaml").is_file():
        return {}
    from dvc.dependency.param import ParamsDependency
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    logging.getLogger("dvc").setLevel(logging.WARNING)  # DVC's hashing bars in a stage's log: no
    try:
        with Repo(str(root)) as repo:
            (found,) = repo.stage.collect(stage)
            return {str(dep.def_path): dep.get_hash().value for dep in found.deps
                    if not isinstance(dep, ParamsDependency) and dep.exists}
    except DvcException as err:  # e.g. no such stage: the run is still recorded, without hashes
        print(f"tracking: no DVC input hashes for stage {stage!r}: {err}")
        return {}


def dvc_invocation() -> str | None:
    """'<host>:<pid>:<start>' of the `dvc` process this process runs under (None if there is none,
    or no /proc to look in). The start time (clock ticks since boot) tells apart a reused pid."""
    pid = os.getppid()
    for _ in range(6):  # stage -> shell -> dvc; a launcher (ranks) adds one
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        names = [Path(a.decode(errors="replace")).name for a in argv[:3]]
        if names[:1] == ["dvc"] or names[1:2] == ["dvc"] or names[1:3] == ["-m", "dvc"]:
            return f"{socket.gethostname()}:{pid}:{fields[19]}"
        pid = int(fields[1])
        if pid <= 1:
            return None
    return None


@contextmanager
def parent_run(run_cfg: RunSection, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> Iterator[str]:
    """An MLflow run whose id the stages see in TAPO_MLFLOW_PARENT_RUN; FAILED if the body raises.

    Created with the MLflow client (not `mlflow.start_run`), so the stage runs the library opens
    with the fluent API are not blocked by an active run."""
    client = _client(run_cfg)
    experiment_id = _experiment_id(run_cfg)
    mark_abandoned_runs(client, experiment_id)
    run_id = client.create_run(experiment_id, run_name=name,
                               tags={"stage": "pipeline", OWNER_TAG: owner(), **tags}).info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(params).items()])
    with _env(PARENT_ENV, run_id), _terminated(client, run_id):
        yield run_id


def dvc_parent(cfg: RunConfig, invocation: str) -> str:
    """The parent run of this `dvc repro`/`dvc exp run` invocation: found by tag, else created."""
    client = _client(cfg.run)
    experiment_id = _experiment_id(cfg.run)
    found = client.search_runs([experiment_id], f"tags.{INVOCATION_TAG} = '{invocation}'", max_results=1)
    if found:
        return found[0].info.run_id
    tags = {"stage": "pipeline", "mode": "dvc", "git_commit": git_commit(), INVOCATION_TAG: invocation,
            OWNER_TAG: invocation}  # '<host>:<pid>:<start>' like every owner: open while that dvc process runs
    tags |= {f"dvc.{k.lower()}": v for k in ("DVC_EXP_NAME", "DVC_EXP_BASELINE_REV") if (v := os.environ.get(k))}
    run_id = client.create_run(experiment_id, run_name=dvc_run_name(), tags=tags).info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(cfg.model_dump()).items()])
    return run_id


def dvc_run_name() -> str:
    """A `dvc exp run` parent is named after the experiment; a plain `dvc repro` after when it started."""
    return os.environ.get("DVC_EXP_NAME") or f"dvc-repro-{time.strftime('%Y%m%d-%H%M%S')}"


def stage_run_name(stage: str, label: str | None = None) -> str:
    """The stage (`train`, `evaluate-sft`: the parent, named after the experiment, says which pipeline run it belongs
    to, and a name stays short enough for the UI's columns); an ad-hoc run's also names what it ran (its label:
    the model's folder or `--label`), `evaluate-step12`."""
    return f"{stage}-{label}" if label else stage


def copy_headline(client: MlflowClient, stage_run_id: str, parent: str | None, stage: str) -> None:
    """The stage's headline (`pipeline.tracking.views.stage_headline`) as metrics `<stage>/<name>` of the run that
    sums it up: the parent, else a stage run alone that charts no curves (an ad-hoc evaluation, whose row then reads
    beside the pipeline's); the shared `headline` view shows them as columns."""
    summary = parent if parent is not None else None if stage in CURVED_STAGES else stage_run_id
    headline = {f"{stage}/{k}": v for k, v in stage_headline(client.get_run(stage_run_id)).items()}
    if summary is None or not headline:
        return
    client.log_batch(summary, metrics=[Metric(k, v, int(time.time() * 1000), 0) for k, v in headline.items()])
    share_headline_view(client, client.get_run(summary).info.experiment_id, headline)


def reopen(client: MlflowClient, run_id: str) -> None:
    """Mark a finished run RUNNING again with no end time. `MlflowClient.update_run` keeps the end time the run
    got when it finished, so a reopened `dvc repro` parent showed a duration while it ran; the tracking store's own
    update sets one (0, which the UI and this project read as none: no public call clears it)."""
    client._tracking_client.store.update_run_info(run_id, RunStatus.RUNNING, end_time=0, run_name=None)


@contextmanager
def stage_run(cfg: RunConfig, stage: str, label: str | None = None) -> Iterator[str | None]:
    """The stage's MLflow run, a new one nested under the pipeline parent if there is one; yields its id (None
    on data-parallel ranks other than 0). `label`: an ad-hoc run's (flows.outputs.Placement), which names it. On
    success the stage's headline is copied onto the parent (`copy_headline`)."""
    quiet_libraries()
    if int(os.environ.get("RANK", "0")) != 0:
        yield None
        return
    client = _client(cfg.run)
    mark_abandoned_runs(client, _experiment_id(cfg.run))
    parent = os.environ.get(PARENT_ENV)
    invocation = None if parent else dvc_invocation()
    if invocation:  # a plain `dvc repro`: this invocation's parent, open again while this stage runs
        parent = dvc_parent(cfg, invocation)
        reopen(client, parent)
    hashes = dvc_dep_tags(stage_input_hashes(stage))
    tags = {"stage": stage, "git_commit": git_commit(), OWNER_TAG: owner(), **hashes} | (
        {"mlflow.parentRunId": parent} if parent else {}) | ({LABEL_TAG: label} if label else {})
    run_id = client.create_run(_experiment_id(cfg.run), run_name=stage_run_name(stage, label),
                               tags=tags).info.run_id
    with _terminated(client, parent if invocation else None), _terminated(client, run_id), \
            _env(STAGE_RUN_ENV, run_id):
        if invocation and parent is not None:  # (dvc_parent's) it gathers the inputs of every stage this invocation ran
            client.log_batch(parent, tags=[RunTag(k, v) for k, v in hashes.items()])
        yield run_id
        copy_headline(client, run_id, parent, stage)


def log_report(run_cfg: RunSection, run_id: str | None, params: Mapping[str, Any], report: Any) -> None:
    """For a stage whose library opens no run: its config as params, its report as params, the
    report's numbers also as metrics."""
    if run_id is None:
        return
    client = _client(run_cfg)
    values = report if isinstance(report, Mapping) else {"output": report}
    client.log_batch(run_id, params=[Param(k, v) for k, v in (flatten(params) | flatten(values)).items()])
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            client.log_metric(run_id, key, float(value))


def run_url(run_cfg: RunSection, run_id: str) -> str:
    """The run's page in the MLflow UI (`TAPO_MLFLOW_UI_URL`, default the `mlflow ui` address the docs give), in
    the UI's "Model training" mode (`UI_MODE`)."""
    base = os.environ.get(UI_URL_ENV, DEFAULT_UI_URL).rstrip("/")
    experiment_id = _client(run_cfg).get_run(run_id).info.experiment_id
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{UI_MODE}"


def runs_table_url(run_cfg: RunSection) -> str:
    """The experiment's runs table, headline columns first (`pipeline.tracking.views`)."""
    base = os.environ.get(UI_URL_ENV, DEFAULT_UI_URL)
    return experiment_url(base, _experiment_id(run_cfg), UI_MODE)


def _client(run_cfg: RunSection) -> MlflowClient:
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    return MlflowClient(run_cfg.tracking_uri)


def _experiment_id(run_cfg: RunSection) -> str:
    return open_experiment(run_cfg)


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextmanager
def _terminated(client: MlflowClient, run_id: str | None) -> Iterator[None]:
    """Mark `run_id` FINISHED when the body returns, FAILED when it raises, KILLED when a signal (SIGINT,
    SIGTERM: KeyboardInterrupt, SystemExit, Prefect's TerminationSignal) ends it (nothing for None)."""
    status = KILLED
    try:
        yield
        status = FINISHED
    except Exception:
        status = FAILED
        raise
    finally:
        if run_id is not None:
            client.set_terminated(run_id, status)
