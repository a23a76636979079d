"""A training stage killed mid-run resumes when `dvc repro` runs it again, and ends as an uninterrupted run would.

Found with a killed experiment: `dvc repro` re-ran the train stage with the same command, and the fresh start
removed the checkpoints the killed attempt had saved (an hour of training, on the learning-cpu preset), while DVC
had removed the per-step history the resume would finish from. Now the stage resumes its own unfinished run
(`train.resume: auto`, `pipeline.trainer.run_inputs`) and the history is kept in the run's folder too.

The workspace holds the real train stage of dvc.yaml (its command and outputs) over a toy model and problems. The
first attempt is the stage's own command with one change: it SIGKILLs itself right after the checkpoint of step 2
of 3 (a deterministic point; the kill is real). Then `dvc repro` resumes it, and `dvc repro -f` (a finished run
asked to run again) trains from step 0: both must end with the same weights and the same per-step metrics.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers.workspace import subprocess_env
from tests.train.toy_task import build_direct_model, toy_config

pytestmark = pytest.mark.slow

STEPS, KILL_AFTER = 3, 2
TIMING = re.compile(r"(wall_s|_s/|seconds|per_s|idle_fraction|latency)")
KILLED_ATTEMPT = r"""
import os, signal, sys
import pipeline.trainer.replicas as replicas
save = replicas.OneProcess.save_checkpoint
def save_then_die(self, root, state, *args, **kwargs):
    saved = save(self, root, state, *args, **kwargs)
    if state.step == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return saved
replicas.OneProcess.save_checkpoint = save_then_die
from flows.cli import main
main("train", ["--params", "params.yaml"])
"""


@pytest.fixture()
def workspace(tmp_path: Path, repo_root: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("pipeline", "flows", "sandbox"):
        shutil.copytree(repo_root / name, ws / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("prefect.toml", ".dvcignore"):
        shutil.copy(repo_root / name, ws / name)
    build_direct_model(ws / "model")
    params = toy_config(ws, ws / "model", group_size=4, steps=STEPS, checkpoint_every=1).model_dump(mode="json")
    params["run"]["tracking_uri"] = "sqlite:///mlruns.db"
    params["train"] |= {"train_file": "train.jsonl", "init_model": "model", "checkpoint_dir": "runs/train",
                        "output_dir": "models/policy"}
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stage = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]["train"]
    stage["deps"] = ["model", "train.jsonl", "pipeline", "flows", "sandbox"]
    (ws / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": stage}}, sort_keys=False))
    subprocess.run([str(Path(sys.executable).with_name("dvc")), "init", "--no-scm", "-q"], cwd=ws, check=True)
    return ws


def run_in(ws: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ws, env=env, capture_output=True, text=True, timeout=900)


def outputs(ws: Path) -> tuple[dict[int, dict], dict[str, torch.Tensor]]:
    rows = [json.loads(line) for line in (ws / "metrics" / "train_history.jsonl").read_text().splitlines()]
    history = {r["step"]: {k: v for k, v in r.items() if not TIMING.search(k)} for r in rows}
    assert len(history) == len(rows), "a step is logged twice"
    return history, load_file(ws / "models" / "policy" / "model.safetensors")


def test_a_killed_training_resumes_under_dvc_repro_and_ends_as_an_uninterrupted_run(
        workspace: Path, prefect_server: str, tmp_path: Path) -> None:
    ws, env = workspace, subprocess_env(prefect_server, tmp_path / "prefect-home")
    dvc = str(Path(sys.executable).with_name("dvc"))

    killed = run_in(ws, [sys.executable, "-c", KILLED_ATTEMPT, str(KILL_AFTER)], env)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run_dir,) = (ws / "runs" / "train").iterdir()
    assert (run_dir / "checkpoints" / f"step-{KILL_AFTER:06d}" / "state.json").is_file()
    assert not (ws / "models" / "policy").exists()

    resumed = run_in(ws, [dvc, "repro"], env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert f"resuming the interrupted run in {run_dir.relative_to(ws)} from step-{KILL_AFTER:06d}" in log, log[-3000:]
    assert "removes the checkpoints" not in log
    history, weights = outputs(ws)
    assert sorted(history) == list(range(STEPS))  # the steps before the kill too, though DVC removed the outputs
    assert (run_dir / "finished.json").is_file()

    again = run_in(ws, [dvc, "repro", "-f"], env)  # a finished run, run again: from step 0
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    log = again.stdout + again.stderr
    assert "finished; training it again from step 0" in log and "removes the checkpoints" in log, log[-3000:]
    straight_history, straight_weights = outputs(ws)
    assert history == straight_history
    assert sorted(weights) == sorted(straight_weights)
    assert all(torch.equal(weights[name], straight_weights[name]) for name in weights)
