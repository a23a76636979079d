"""Prefect shows each stage's result: the flow run publishes a markdown artifact (the evaluation table, the
training summary, a stage's report) linking its MLflow run; a nightly `dvc repro` with nothing to do records
that and leaves no empty MLflow run behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from prefect.artifacts import Artifact
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.summary import markdown_table
from flows.pipeline import pipeline_flow
from pipeline.paths import REPO_ROOT

pytestmark = pytest.mark.slow
GIT = ["git", "-c", "user.name=tapo-test", "-c", "user.email=tapo-test@example.invalid"]


def test_a_report_reads_as_a_table() -> None:
    assert markdown_table({"n_train": 6, "accuracy": 0.123456, "output_dir": "data/curated"}) == (
        "| | |\n|---|---|\n| n_train | 6 |\n| accuracy | 0.1235 |\n| output_dir | data/curated |")


def up_to_date_workspace(ws: Path) -> Path:
    """A git + DVC checkout whose one stage has run: `dvc repro` has nothing to do."""
    ws.mkdir()
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["run"] |= {"tracking_uri": f"sqlite:///{ws / 'mlruns.db'}", "experiment": "nightly-test"}
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (ws / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"touch": {
        "cmd": "python -c \"open('out.txt', 'w').write('x')\"", "outs": ["out.txt"]}}}))
    dvc = str(Path(sys.executable).with_name("dvc"))
    subprocess.run([*GIT, "init", "-q"], cwd=ws, check=True)
    subprocess.run([dvc, "init", "-q"], cwd=ws, check=True)
    subprocess.run([dvc, "repro", "-q"], cwd=ws, check=True, capture_output=True)
    return ws


def test_a_night_with_nothing_to_do_opens_no_mlflow_run(tmp_path: Path, prefect_server: str) -> None:
    ws = up_to_date_workspace(tmp_path / "ws")
    with temporary_settings({PREFECT_API_URL: prefect_server}):
        result = pipeline_flow("params.yaml", use_dvc=True, workdir=str(ws))
        artifact = Artifact.get("pipeline-summary")
    assert result == {"parent_run_id": None, "up_to_date": True}
    experiment = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}").get_experiment_by_name("nightly-test")
    assert experiment is None or not MlflowClient(f"sqlite:///{ws / 'mlruns.db'}").search_runs(
        [experiment.experiment_id])
    assert artifact is not None and "nothing to do" in artifact.data and "up to date" in artifact.data
