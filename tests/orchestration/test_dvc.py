"""DVC in a scratch workspace: the pipeline flow's dvc mode under an MLflow parent run, and a local remote.

The first stages of the real dvc.yaml (prepare-model on a tiny model, build-index, curate on a few
calculator problems) run through `pipeline_flow(use_dvc=True)`: each stage process opens one
run nested under the flow's parent, tagged with its inputs' hashes as dvc.lock records them.
Their outputs are then pushed to a directory remote, deleted with the cache, and pulled back
byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.pipeline import pipeline_flow
from flows.tracking import LockFileError, dvc_input_hashes
from pipeline.tracking.runs import DVC_TAG_PREFIX
from tests.helpers.workspace import TINY_EVAL, make_workspace, merge

pytestmark = pytest.mark.slow

TINY_STAGES = merge({"model": {"path": "tiny-model"}, "curate": {"calculator": {"n_train": 6, "n_test": 2}}},
                    TINY_EVAL)
OUTPUTS = ("models/base", "data/search/index", "data/curated")
# later stages never ran here: name the targets (curation keeps the fact questions search can answer)
RAN = ("prepare-model", "build-index", "curate")


def _dvc(ws: Path, *args: str) -> subprocess.CompletedProcess:
    dvc = str(Path(sys.executable).with_name("dvc"))
    result = subprocess.run([dvc, *args], cwd=ws, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"dvc {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for out in OUTPUTS for p in sorted((root / out).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def repro_workspace(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_server: str) -> Path:
    ws = make_workspace(tmp_path_factory.mktemp("dvc") / "ws", repo_root, TINY_STAGES)
    _dvc(ws, "init", "--no-scm", "-q")
    saved_cwd, saved_url = Path.cwd(), os.environ.get("PREFECT_API_URL")
    os.chdir(ws)
    os.environ["PREFECT_API_URL"] = prefect_server  # the stage processes dvc starts report to our server
    try:
        with temporary_settings({PREFECT_API_URL: prefect_server}):
            pipeline_flow("params.yaml", use_dvc=True, dvc_args=("repro", *RAN))
    finally:
        os.chdir(saved_cwd)
        if saved_url is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = saved_url
    return ws


def test_dvc_mode_parent_and_stage_runs_are_tagged_with_commit_and_input_hashes(repro_workspace: Path) -> None:
    ws = repro_workspace
    hashes = dvc_input_hashes(ws / "dvc.lock")
    assert {"pipeline/model.py", "flows/curate.py", "pipeline/data"} <= hashes.keys()
    client = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}")
    experiment = client.get_experiment_by_name(TINY_EVAL["run"]["experiment"])
    (parent,) = client.search_runs([experiment.experiment_id], "tags.stage = 'pipeline'")
    assert parent.info.status == "FINISHED" and parent.data.tags["mode"] == "dvc"
    assert len(parent.data.tags["git_commit"]) == 40
    recorded = {k.removeprefix(DVC_TAG_PREFIX): v for k, v in parent.data.tags.items() if k.startswith(DVC_TAG_PREFIX)}
    assert recorded == hashes
    assert parent.data.params["model.path"] == "tiny-model"
    lock = yaml.safe_load((ws / "dvc.lock").read_text())["stages"]
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.data.tags["stage"] for r in children) == sorted(RAN)  # one run per stage
    for run in children:
        tagged = {k.removeprefix(DVC_TAG_PREFIX): v for k, v in run.data.tags.items() if k.startswith(DVC_TAG_PREFIX)}
        assert tagged == {d["path"]: d["md5"] for d in lock[run.data.tags["stage"]]["deps"]}
        assert run.info.status == "FINISHED"


def test_local_remote_push_delete_pull_restores_outputs(repro_workspace: Path, tmp_path: Path) -> None:
    ws = repro_workspace
    before = _digests(ws)
    assert any(k.startswith("models/base/") for k in before) and "data/curated/test.jsonl" in before
    _dvc(ws, "remote", "add", "-d", "local", str(tmp_path / "remote"))
    _dvc(ws, "push", *RAN)
    assert any((tmp_path / "remote").rglob("*")), "push stored nothing in the remote"
    for out in OUTPUTS:
        shutil.rmtree(ws / out)
    shutil.rmtree(ws / ".dvc/cache")
    assert "not in cache" in _dvc(ws, "status", *RAN).stdout
    _dvc(ws, "pull", *RAN)
    assert _digests(ws) == before
    assert "up to date" in _dvc(ws, "status", *RAN).stdout.lower()


def test_bad_lock_file_is_a_clear_error(tmp_path: Path) -> None:
    assert dvc_input_hashes(tmp_path / "dvc.lock") == {}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"a": {"deps": [{"path": "x"}]}}}))
    with pytest.raises(LockFileError, match="stage 'a'"):
        dvc_input_hashes(tmp_path / "dvc.lock")
    (tmp_path / "dvc.lock").write_text("stages: [unclosed")
    with pytest.raises(LockFileError, match="not valid YAML"):
        dvc_input_hashes(tmp_path / "dvc.lock")
