"""Ad-hoc runs never write into DVC's outputs: `flows.evaluate --model X`, `flows.train --params other.yaml`
(and any run given a label) place every output path that DVC tracks under runs/<stage>/<label>/; the stage
command dvc.yaml runs writes in place."""

from __future__ import annotations

import re
import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml
from prefect.artifacts import Artifact
from prefect.settings import PREFECT_API_URL, temporary_settings
from hypothesis import given
from hypothesis import strategies as st

from flows.outputs import RUNS_ROOT, dvc_tracked, label_of, placement, touches
from tests.helpers.workspace import TINY_EVAL, make_workspace, subprocess_env

REPO = Path(__file__).resolve().parents[2]
TRACKED = dvc_tracked(REPO / "dvc.yaml")
# What the stages write, as params.yaml names it: every one is (or holds) a DVC-tracked output.
STAGE_OUTPUTS = ["models/policy", "metrics", "metrics/eval.json", "metrics/train_curve.csv", "models/sft",
                 "data/curated", "metrics/eval_plots"]
ELSEWHERE = ["runs/evaluate-latest/v3", "scratch/out", "models-extra/x", "metricsfoo"]


@pytest.fixture()
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def test_the_tracked_paths_are_read_from_dvc_yaml() -> None:
    assert {"models/policy", "metrics/train.json", "metrics/eval.json", "metrics/eval_samples.jsonl",
            "data/curated"} <= {str(p) for p in TRACKED}


@pytest.mark.parametrize("path", STAGE_OUTPUTS)
def test_stage_outputs_touch_dvc(path: str) -> None:
    assert touches(path, TRACKED)


@pytest.mark.parametrize("path", ELSEWHERE)
def test_other_paths_do_not(path: str) -> None:
    assert not touches(path, TRACKED)


@pytest.mark.parametrize(("stage", "params", "label", "out", "ad_hoc", "root"), [
    ("train", "params.yaml", None, None, False, None),  # the DVC stage's own command
    ("evaluate", "params.yaml", None, None, False, None),
    ("train", "configs/other.yaml", None, None, False, "runs/train/other"),
    ("train", "params.yaml", "lr-sweep", None, False, "runs/train/lr-sweep"),
    ("evaluate", "params.yaml", "runs/step2", None, True, "runs/evaluate/step2"),  # --model runs/step2
    ("evaluate", "params.yaml", "models:/tapo-policy/3", None, True, "runs/evaluate/tapo-policy-v3"),
    ("evaluate", "params.yaml", "models:/tapo-policy@champion", None, True, "runs/evaluate/tapo-policy-champion"),
    ("evaluate", "params.yaml", "x", "scratch/here", True, "scratch/here"),  # told otherwise
    ("evaluate", "configs/other.yaml", "x", ".", True, None),  # told: in place
], ids=["train-stage", "evaluate-stage", "train-other-params", "train-label", "evaluate-model-dir",
        "evaluate-model-version", "evaluate-model-alias", "evaluate-out", "evaluate-out-in-place"])
def test_where_a_run_writes(in_repo: None, stage: str, params: str, label: str | None, out: str | None,
                            ad_hoc: bool, root: str | None) -> None:
    place = placement(stage, params, label=label, out=out, ad_hoc=ad_hoc)
    assert place.root == (Path(root) if root else None)
    for path in STAGE_OUTPUTS:
        assert place.place(path) == (Path(root) / path if root else Path(path))
    for path in ELSEWHERE:
        assert place.place(path) == Path(path)


segment = st.sampled_from(["models", "metrics", "data", "policy", "sft", "curated", "eval.json", "x", "runs"])


@given(parts=st.lists(segment, min_size=1, max_size=4), label=st.text(min_size=1, max_size=30),
       model=st.booleans())
def test_an_ad_hoc_run_never_writes_a_tracked_path(parts: list[str], label: str, model: bool) -> None:
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        place = placement("evaluate" if model else "train", "params.yaml", label=label, out=None, ad_hoc=model)
        placed = place.place("/".join(parts))
    finally:
        os.chdir(cwd)
    assert not touches(placed, TRACKED)
    assert placed.parts[0] == RUNS_ROOT.name or not touches("/".join(parts), TRACKED)
    assert "/" not in label_of(label) and label_of(label) not in ("", ".", "..")


def test_an_absolute_path_inside_the_checkout_is_placed_too(in_repo: None) -> None:
    place = placement("train", "other.yaml", label=None, out=None, ad_hoc=False)
    assert place.place(REPO / "models" / "policy") == RUNS_ROOT / "train" / "other" / "models" / "policy"
    assert touches(PurePosixPath("metrics"), TRACKED) and not touches("/tmp/elsewhere/metrics", TRACKED)


@pytest.mark.slow
def test_an_ad_hoc_evaluation_leaves_dvc_outputs_alone(tmp_path: Path, repo_root: Path, prefect_server: str) -> None:
    """`python -m flows.evaluate --model tiny-model` in a workspace: its outputs under runs/evaluate/tiny-model/,
    nothing under metrics/; the flow run publishes the evaluation table, linking its MLflow run."""
    ws = make_workspace(tmp_path / "ws", repo_root, TINY_EVAL)
    env = {**subprocess_env(prefect_server, tmp_path / "prefect"), "PYTHONPATH": str(ws),
           "TAPO_MLFLOW_UI_URL": "http://mlflow.example:5000"}
    done = subprocess.run([sys.executable, "-m", "flows.evaluate", "--params", "params.yaml", "--model", "tiny-model"],
                          cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (ws / "metrics").exists()
    written = ws / "runs" / "evaluate" / "tiny-model" / "metrics"
    assert json.loads((written / "eval.json").read_text())["n_problems"] == 2
    assert (written / "eval_samples.jsonl").is_file() and (written / "eval_table.md").is_file()
    assert yaml.safe_load((ws / "params.yaml").read_text())["evaluate"]["output_dir"] == "metrics"
    with temporary_settings({PREFECT_API_URL: prefect_server}):
        artifact = Artifact.get("evaluate-summary")
    assert artifact is not None and re.search(r"^\| Method +\|", artifact.data, re.M) and "runs/evaluate/tiny-model/metrics" in artifact.data
    assert "](http://mlflow.example:5000/#/experiments/" in artifact.data
