"""The pipeline's MLflow runs: one parent, one nested run per stage whoever opens it, the parent of a
plain `dvc repro` found by its invocation, failures marked FAILED, checkpoints logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

import flows.tracking
from flows.tracking import INVOCATION_TAG, dvc_invocation, log_report, parent_run, runs_table_url, stage_run
from pipeline.config import RunConfig
from pipeline.config.run import RunSection
from pipeline.tracking.history import MetricHistory
from pipeline.tracking.runs import (LABEL_TAG, PARENT_ENV, RESUMED_AT_TAG, RESUMED_BY_TAG, RESUMED_FROM_TAG,
                                    STAGE_RUN_ENV, log_checkpoints, tracked_run)
from pipeline.tracking.views import HEADLINE_VIEW, SHARED_VIEW_TAG, headline_tags


@pytest.fixture()
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunConfig:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    monkeypatch.delenv(STAGE_RUN_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    return RunConfig(run=RunSection(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", experiment="parent-test"))


def _runs(cfg: RunConfig, query: str = "") -> list:
    client = MlflowClient(cfg.run.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.run.experiment)
    return client.search_runs([experiment.experiment_id], query)


def _children(cfg: RunConfig, parent_id: str) -> dict[str, object]:
    runs = _runs(cfg, f"tags.mlflow.parentRunId = '{parent_id}'")
    assert len(runs) == len({r.data.tags["stage"] for r in runs}), "more than one run for a stage"
    return {r.data.tags["stage"]: r for r in runs}


def _two_stages(cfg: RunConfig) -> None:
    """curate (the flow logs its report) and train (the library's tracked_run logs into the stage run)."""
    with stage_run(cfg, "curate") as run_id:
        log_report(cfg.run, run_id, {"curate": {"seed": 3}}, {"n_train": 6, "output_dir": "data/curated"})
    with stage_run(cfg, "train") as run_id, tracked_run(cfg.run, "train", {"train": {"optimizer": {"lr": 1e-6}}}) as active:
        assert active.info.run_id == run_id  # adopted, not a second run
        mlflow.log_metric("reward/mean", 0.5)


def test_each_stage_has_one_run_nested_under_the_parent(cfg: RunConfig) -> None:
    with parent_run(cfg.run, "pipeline", {"train": {"optimizer": {"lr": 1e-6}}}, {"git_commit": "c0ffee"}) as parent_id:
        assert os.environ[PARENT_ENV] == parent_id
        _two_stages(cfg)
    assert PARENT_ENV not in os.environ and STAGE_RUN_ENV not in os.environ
    parent = MlflowClient(cfg.run.tracking_uri).get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["git_commit"] == "c0ffee"
    assert parent.data.params["train.optimizer.lr"] == "1e-06"
    stages = _children(cfg, parent_id)
    assert stages.keys() == {"curate", "train"}
    assert stages["curate"].data.metrics["n_train"] == 6 and stages["curate"].data.params["curate.seed"] == "3"
    assert stages["train"].data.metrics["reward/mean"] == 0.5 and stages["train"].data.params["train.optimizer.lr"] == "1e-06"
    assert all(r.info.status == "FINISHED" and len(r.data.tags["git_commit"]) == 40 for r in stages.values())
    assert len(_runs(cfg)) == 3


def test_plain_dvc_repro_stages_share_the_parent_of_their_invocation(cfg: RunConfig,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: "host:4242:777")
    _two_stages(cfg)
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: "host:4243:900")  # the next `dvc repro`
    with pytest.raises(RuntimeError, match="stage broke"), stage_run(cfg, "evaluate"):
        raise RuntimeError("stage broke")
    parents = {r.data.tags[INVOCATION_TAG]: r for r in _runs(cfg, "tags.stage = 'pipeline'")}
    assert parents.keys() == {"host:4242:777", "host:4243:900"}
    first, second = parents["host:4242:777"], parents["host:4243:900"]
    assert first.info.status == "FINISHED" and first.data.tags["mode"] == "dvc"
    assert first.data.params["run.experiment"] == "parent-test"
    assert _children(cfg, first.info.run_id).keys() == {"curate", "train"}
    assert second.info.status == "FAILED"
    (evaluate,) = _children(cfg, second.info.run_id).values()
    assert evaluate.info.status == "FAILED"


def test_a_stage_outside_any_pipeline_is_a_top_level_run(cfg: RunConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: None)
    with stage_run(cfg, "curate"):
        pass
    (run,) = _runs(cfg)
    assert run.data.tags["stage"] == "curate" and "mlflow.parentRunId" not in run.data.tags


def test_a_resumed_training_is_a_run_of_its_own_under_the_invocation_that_resumes(
        cfg: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `dvc repro` is stopped after its training logged steps 0-3 (its checkpoint is at step 2); the next one
    resumes. The killed attempt's run stays KILLED under its own invocation's parent; the resuming invocation's
    parent holds the train run that finished, which has every step once (0-1 from the history, 2-3 its own)."""
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: "host:4245:1")
    path = tmp_path / "train_history.jsonl"
    with pytest.raises(KeyboardInterrupt), stage_run(cfg, "train") as killed, tracked_run(cfg.run, "train", {}):
        history = MetricHistory(path)
        for step in range(4):
            history.log(step, {"reward/mean": step / 10, "train/loss": 1.0 + step})
        raise KeyboardInterrupt  # the stop (SIGKILL: mark_abandoned_runs, tests/faults/test_orphans.py)
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: "host:4246:2")
    with stage_run(cfg, "train") as resumed, tracked_run(cfg.run, "train", {}, resumed_from=killed, resumed_at=2):
        history = MetricHistory(path, resume_at=2)
        history.log_earlier_steps()
        for step in (2, 3):
            history.log(step, {"reward/mean": step / 10 + 0.5, "train/loss": 1.5 + step})
    parents = {r.data.tags[INVOCATION_TAG]: r for r in _runs(cfg, "tags.stage = 'pipeline'")}
    assert {k: r.info.status for k, r in parents.items()} == {"host:4245:1": "KILLED", "host:4246:2": "FINISHED"}
    (first,) = _children(cfg, parents["host:4245:1"].info.run_id).values()
    (second,) = _children(cfg, parents["host:4246:2"].info.run_id).values()
    assert (first.info.run_id, first.info.status) == (killed, "KILLED")
    assert (second.info.run_id, second.info.status) == (resumed, "FINISHED")
    assert second.data.tags[RESUMED_FROM_TAG] == killed and second.data.tags[RESUMED_AT_TAG] == "2"
    assert first.data.tags[RESUMED_BY_TAG] == resumed
    client = MlflowClient(cfg.run.tracking_uri)
    for key, values in {"reward/mean": [0.0, 0.1, 0.7, 0.8], "train/loss": [1.0, 2.0, 3.5, 4.5]}.items():
        logged = sorted((m.step, m.value) for m in client.get_metric_history(resumed, key))
        assert logged == list(enumerate(values))  # each step once: the resumed values past the checkpoint
        assert [m.step for m in client.get_metric_history(killed, key)] == [0, 1, 2, 3]  # what it did, as it was


def test_other_ranks_record_nothing(cfg: RunConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    with stage_run(cfg, "train") as run_id:
        assert run_id is None and STAGE_RUN_ENV not in os.environ
    assert MlflowClient(cfg.run.tracking_uri).get_experiment_by_name(cfg.run.experiment) is None


def test_failure_marks_the_parent_failed_and_restores_the_env(cfg: RunConfig,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARENT_ENV, "outer")
    with pytest.raises(RuntimeError, match="stage broke"), parent_run(cfg.run, "pipeline", {}, {}) as parent_id:
        raise RuntimeError("stage broke")
    assert os.environ[PARENT_ENV] == "outer"
    assert MlflowClient(cfg.run.tracking_uri).get_run(parent_id).info.status == "FAILED"


def test_invocation_is_the_dvc_process_above(tmp_path: Path) -> None:
    assert dvc_invocation() is None  # pytest does not run under dvc
    fake = tmp_path / "dvc"  # a `dvc` that starts a stage through a shell, as dvc does
    probe = f"{sys.executable} -c 'from flows.tracking import dvc_invocation; print(dvc_invocation())'"
    fake.write_text(f"#!/bin/sh\n/bin/sh -c \"{probe}\"\necho pid=$$\n")
    fake.chmod(0o755)
    out = subprocess.run([str(fake)], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
                         check=True).stdout.split()
    host, pid, start = out[0].split(":")
    assert out[1] == f"pid={pid}" and start.isdigit() and host


def test_checkpoints_logged_metadata_each_whole_the_last(cfg: RunConfig, tmp_path: Path) -> None:
    checkpoints = []
    for step in (1, 2):
        ckpt = tmp_path / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text(json.dumps({"step": step}))
        (ckpt / "model.safetensors").write_bytes(b"w" * step)
        checkpoints.append(ckpt)
    with stage_run(cfg, "train") as run_id:
        pass
    assert log_checkpoints(cfg.run, run_id, checkpoints[::-1]) == ["checkpoints/step-000001", "checkpoints/step-000002"]
    client = MlflowClient(cfg.run.tracking_uri)
    listed = {d: sorted(Path(f.path).name for f in client.list_artifacts(run_id, d)) for d in
              ("checkpoints/step-000001", "checkpoints/step-000002")}
    assert listed == {"checkpoints/step-000001": ["state.json"],
                      "checkpoints/step-000002": ["model.safetensors", "state.json"]}


def test_the_ui_opens_on_runs_named_after_their_pipeline_with_headline_metrics(
        cfg: RunConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The experiment is a classic ML one (MLflow opens it on the runs table); a `dvc exp run` parent is named
    after the experiment, its stages by their stage alone (`<parent>/<stage>` was cut in the UI's columns); each
    stage's headline (metrics or, for a run with curves, tags) reaches the parent as metrics, which the shared
    `headline` view shows first."""
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: "host:4244:901")
    monkeypatch.setenv("DVC_EXP_NAME", "lr-sweep-3e6")
    with stage_run(cfg, "train") as run_id, tracked_run(cfg.run, "train", {}):
        mlflow.set_tags(headline_tags({"accuracy": 0.4, "reward": 0.25}))
        mlflow.log_metric("reward/std", 0.1)
    with stage_run(cfg, "evaluate-sft"), tracked_run(cfg.run, "evaluate-sft", {}):
        mlflow.log_metric("headline/accuracy", 0.3)
    with pytest.raises(RuntimeError), stage_run(cfg, "evaluate"), tracked_run(cfg.run, "evaluate", {}):
        mlflow.log_metric("headline/accuracy", 0.9)
        raise RuntimeError("evaluation broke")  # a failed stage's numbers are not the pipeline's
    client = MlflowClient(cfg.run.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.run.experiment)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    (parent,) = _runs(cfg, "tags.stage = 'pipeline'")
    assert parent.info.run_name == "lr-sweep-3e6"
    assert parent.data.metrics == {"train/accuracy": 0.4, "train/reward": 0.25, "evaluate-sft/accuracy": 0.3}
    names = {r.data.tags["stage"]: r.info.run_name for r in _children(cfg, parent.info.run_id).values()}
    assert names == {"train": "train", "evaluate-sft": "evaluate-sft", "evaluate": "evaluate"}
    assert client.get_run(run_id).data.metrics == {"reward/std": 0.1}  # no single-value bars beside its curves
    view = json.loads(experiment.tags[SHARED_VIEW_TAG + HEADLINE_VIEW])["selectedColumns"]
    assert view == ["metrics.`train/reward`", "metrics.`train/accuracy`", "metrics.`evaluate-sft/accuracy`",
                    "attributes.`Duration`"]
    assert runs_table_url(cfg.run).endswith(f"/#/experiments/{experiment.experiment_id}?viewStateShareKey=headline&"
                                            "workflowType=machine_learning")


def test_a_pipeline_parent_names_its_stage_runs(cfg: RunConfig) -> None:
    with parent_run(cfg.run, "crimson-fox", {}, {}) as parent_id:
        _two_stages(cfg)
    names = {r.data.tags["stage"]: r.info.run_name for r in _children(cfg, parent_id).values()}
    assert names == {"curate": "curate", "train": "train"}


@pytest.mark.parametrize(("stage", "label", "name"), [("evaluate", "step12", "evaluate-step12"),
                                                      ("evaluate-sft", "mine", "evaluate-sft-mine"),
                                                      ("train", None, "train"), ("curate", "try-1", "curate-try-1")])
def test_an_ad_hoc_stage_run_is_named_after_what_it_ran(cfg: RunConfig, monkeypatch: pytest.MonkeyPatch, stage: str,
                                                        label: str | None, name: str) -> None:
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: None)
    with stage_run(cfg, stage, label) as run_id:
        pass
    run = MlflowClient(cfg.run.tracking_uri).get_run(run_id)
    assert run.info.run_name == name and run.data.tags.get(LABEL_TAG) == label


def test_a_stage_run_alone_sums_itself_up_unless_it_charts_curves(cfg: RunConfig,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An ad-hoc evaluation (no parent) carries its headline as `evaluate/<name>`, the pipeline's columns, so its row
    reads beside the pipeline runs'; a training alone keeps them as tags (no bars beside its curves)."""
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: None)
    with stage_run(cfg, "evaluate", "step12") as evaluation, tracked_run(cfg.run, "evaluate", {}):
        mlflow.log_metric("headline/accuracy", 0.5179)
    with stage_run(cfg, "train", "mine") as training, tracked_run(cfg.run, "train", {}):
        mlflow.set_tags(headline_tags({"reward": 0.44}))
    client = MlflowClient(cfg.run.tracking_uri)
    assert client.get_run(evaluation).data.metrics == {"headline/accuracy": 0.5179, "evaluate/accuracy": 0.5179}
    assert client.get_run(training).data.metrics == {}


def test_a_dvc_repro_parent_runs_without_an_end_while_a_stage_runs(cfg: RunConfig,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain `dvc repro`'s parent is RUNNING with no end time (no duration) while each stage runs, and ends with
    it; it showed the previous stage's end (a duration) while the next ran."""
    monkeypatch.setattr(flows.tracking, "dvc_invocation", lambda: "host:4247:3")
    client = MlflowClient(cfg.run.tracking_uri)

    def parent():
        (found,) = _runs(cfg, "tags.stage = 'pipeline'")
        return client.get_run(found.info.run_id).info

    for stage in ("curate", "train"):
        with stage_run(cfg, stage):
            running = parent()
            assert running.status == "RUNNING" and not running.end_time
        ended = parent()
        assert ended.status == "FINISHED" and ended.end_time >= ended.start_time
