"""The whole pipeline through `dvc repro`, on a tiny model, in a scratch workspace.

Checks the acceptance points of the pipeline: every stage runs through its Prefect flow and
writes its metrics; a second `dvc repro` runs nothing; changing one param re-runs only the
stages that read it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.workspace import make_workspace

pytestmark = pytest.mark.slow

TINY = {
    "model": {"path": "tiny-model"},
    "curate": {"calculator": {"n_train": 12, "n_test": 4}},
    "rollout": {"group_size": 2, "max_policy_tokens": 12, "max_total_tokens": 2048, "max_batch_sequences": 4},
    # dynamic sampling off: a random tiny model earns equal rewards, and the step must still run
    "train": {"steps": 2, "prompts_per_step": 2, "max_gen_rounds": 1, "checkpoint_every": 1, "lr": 1e-4,
              "algorithm": {"kind": "dapo", "dynamic_sampling": False}},
    "evaluate": {"limit": 4},
}


def _dvc(workspace: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    dvc = Path(sys.executable).with_name("dvc")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PREFECT_API_URL": os.environ.get("TAPO_TEST_PREFECT_API_URL", "")}
    result = subprocess.run([str(dvc), *args], cwd=workspace, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"dvc {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_server: str) -> Path:
    # One Prefect server for all stages instead of a temporary one per stage process.
    os.environ["TAPO_TEST_PREFECT_API_URL"] = prefect_server
    ws = make_workspace(tmp_path_factory.mktemp("ws"), repo_root, TINY)
    _dvc(ws, "init", "--no-scm", "-q", "--force")
    return ws


def test_repro_runs_every_stage(workspace: Path) -> None:
    _dvc(workspace, "repro")
    train = json.loads((workspace / "metrics/train.json").read_text())
    evaluation = json.loads((workspace / "metrics/eval.json").read_text())
    assert "reward/mean" in train and "train/grad_norm" in train
    assert evaluation["n_problems"] == 4 and 0.0 <= evaluation["all/accuracy"] <= 1.0
    assert (workspace / "models/policy/config.json").is_file()
    curve = (workspace / "metrics/train_curve.csv").read_text().splitlines()
    assert len(curve) == 1 + TINY["train"]["steps"]
    assert (workspace / "mlruns.db").is_file()


def test_second_repro_runs_nothing(workspace: Path) -> None:
    out = _dvc(workspace, "repro").stdout
    assert "Running stage" not in out, out


def test_changing_one_param_reruns_only_its_stages(workspace: Path) -> None:
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["evaluate"]["limit"] = 3
    (workspace / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _dvc(workspace, "repro").stdout
    assert "Running stage 'evaluate'" in out
    assert all(f"Running stage '{s}'" not in out for s in ("prepare-model", "curate", "train")), out
    assert json.loads((workspace / "metrics/eval.json").read_text())["n_problems"] == 3
