"""The pipeline's MLflow parent run: stage runs nest under it, a failure marks it FAILED."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from flows.pipeline import nested_stage_run, parent_run
from pipeline.config.run import RunSection
from pipeline.tracking import PARENT_ENV, tracked_run


@pytest.fixture()
def run_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunSection:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    return RunSection(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", experiment="parent-test")


def test_stage_runs_nest_under_the_parent(run_cfg: RunSection) -> None:
    with parent_run(run_cfg, "pipeline", {"train": {"lr": 1e-6}}, {"git_commit": "c0ffee"}) as parent_id:
        assert os.environ[PARENT_ENV] == parent_id
        with tracked_run(run_cfg, "train", {}) as child:
            mlflow.log_metric("reward/mean", 0.5)
        nested_stage_run(run_cfg, parent_id, "curate", {"n_train": 6, "output_dir": "data/curated"})
    assert PARENT_ENV not in os.environ
    client = MlflowClient(run_cfg.tracking_uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["git_commit"] == "c0ffee"
    assert parent.data.params["train.lr"] == "1e-06"
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert {r.data.tags["stage"] for r in children} == {"train", "curate"}
    curate = next(r for r in children if r.data.tags["stage"] == "curate")
    assert curate.data.metrics["n_train"] == 6 and curate.data.params["output_dir"] == "data/curated"
    assert client.get_run(child.info.run_id).data.tags["mlflow.parentRunId"] == parent_id


def test_failure_marks_the_parent_failed_and_restores_the_env(run_cfg: RunSection,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARENT_ENV, "outer")
    with pytest.raises(RuntimeError, match="stage broke"), parent_run(run_cfg, "pipeline", {}, {}) as parent_id:
        raise RuntimeError("stage broke")
    assert os.environ[PARENT_ENV] == "outer"
    assert MlflowClient(run_cfg.tracking_uri).get_run(parent_id).info.status == "FAILED"
