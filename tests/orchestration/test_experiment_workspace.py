"""`flows.experiment` with real git and DVC: an experiment is its preset on the committed params, whatever ran
before it in the same workspace, and the workspace's params.yaml is the same bytes after every run, failed or not.

`dvc exp run -S` writes its overrides into the workspace's params.yaml and the next experiment starts from the
workspace, so without putting it back a second preset carried the first one's keys (found running the TEPO
arms one after another). The stage here records the params it read; each experiment's record is read from its
own git ref."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

STAGE = """import json, sys, yaml
p = yaml.safe_load(open("params.yaml"))
json.dump({"seed": p["run"]["seed"], "steps": p["train"]["steps"], "epochs": p["sft"]["epochs"]},
          open("seen.json", "w"))
sys.exit(1 if p["train"]["steps"] == 13 else 0)
"""
DVC_YAML = {"stages": {"see": {"cmd": f"{Path(sys.executable).name} see.py",
                               "params": ["run.seed", "train.steps", "sft.epochs"],
                               "metrics": [{"seen.json": {"cache": False}}]}}}
PRESETS = {"steps": {"train": {"steps": 3}}, "epochs": {"sft": {"epochs": 7}}, "fails": {"train": {"steps": 13}}}


def sh(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, check=check)


@pytest.fixture()
def repo(repo_root: Path, tmp_path: Path) -> Path:
    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "see.py").write_text(STAGE)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML))
    presets = tmp_path / "configs" / "experiments"
    presets.mkdir(parents=True)
    for name, changes in PRESETS.items():
        (presets / f"{name}.yaml").write_text(yaml.safe_dump({"extends": "../../params.yaml", **changes}))
    sh(tmp_path, "git", "init", "-q")
    sh(tmp_path, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "root")
    sh(tmp_path, "dvc", "init", "-q")
    sh(tmp_path, "git", "add", "-A")
    sh(tmp_path, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return tmp_path


def run_preset(repo: Path, preset: str, seed: int, *extra: str) -> subprocess.CompletedProcess:
    return sh(repo, sys.executable, "-m", "flows.experiment", f"configs/experiments/{preset}.yaml",
              "--seeds", str(seed), *extra, check=False)


def seen_by(repo: Path, experiment: str) -> dict:
    refs = sh(repo, "git", "for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    (ref,) = [r for r in refs if r.endswith(f"/{experiment}")]
    return json.loads(sh(repo, "git", "show", f"{ref}:seen.json").stdout)


@pytest.mark.parametrize("first, second", [("steps", "epochs"), ("epochs", "steps"), ("fails", "epochs"),
                                           ("steps", "steps")])
def test_each_experiment_is_its_preset_on_the_committed_params(repo: Path, first: str, second: str) -> None:
    committed = (repo / "params.yaml").read_bytes()
    default = yaml.safe_load(committed)
    done = run_preset(repo, first, 1)
    assert done.returncode == (1 if first == "fails" else 0), done.stderr
    assert (repo / "params.yaml").read_bytes() == committed
    done = run_preset(repo, second, 2)
    assert done.returncode == 0, done.stderr
    assert (repo / "params.yaml").read_bytes() == committed
    expected = {"seed": 2, "steps": default["train"]["steps"], "epochs": default["sft"]["epochs"]}
    for section, values in PRESETS[second].items():
        expected.update({{"train": "steps", "sft": "epochs"}[section]: v for v in values.values()})
    assert seen_by(repo, f"{second}-s2") == expected


def test_a_params_file_changed_since_the_commit_is_refused_by_key(repo: Path) -> None:
    params = repo / "params.yaml"
    data = yaml.safe_load(params.read_text())
    data["train"]["optimizer"]["lr"] = 0.5
    data["sft"]["epochs"] = 9
    params.write_text(yaml.safe_dump(data))
    refused = run_preset(repo, "steps", 0)
    assert refused.returncode == 1
    assert "train.optimizer.lr" in refused.stderr and "sft.epochs" in refused.stderr and "git checkout" in refused.stderr
    assert not sh(repo, "git", "for-each-ref", "refs/exps").stdout.strip()
    allowed = run_preset(repo, "steps", 0, "--allow-changed-params")
    assert allowed.returncode == 0, allowed.stderr
    assert seen_by(repo, "steps-s0") == {"seed": 0, "steps": 3, "epochs": 9}
    assert yaml.safe_load(params.read_text()) == data
