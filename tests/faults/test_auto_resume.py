"""A training stage killed mid-run resumes when `dvc repro` runs it again, and ends as an uninterrupted run would;
one whose state is damaged resumes from what is whole, or stops with one line and trains afresh when run again.

Found with a killed experiment: `dvc repro` re-ran the train stage with the same command, and the fresh start
removed the checkpoints the killed attempt had saved (an hour of training, on the learning-cpu preset), while DVC
had removed the per-step history the resume would finish from. Now the stage resumes its own unfinished run
(`train.checkpoints.resume: auto`, `pipeline.training_run.inputs`) and the history is kept in the run's folder too. Then a fault
campaign found a resume that trusted whatever it found: with the history lost it finished with steps missing and
exit 0; with the newest checkpoint's weights cut short it failed with tracebacks at every retry, ignoring the good
checkpoint beside it; and the resumed run's MLflow run logged re-run steps twice, under the killed invocation's
parent (`pipeline.training_run.resume_point`, `pipeline.tracking.runs`).

The workspace holds the real train stage of dvc.yaml (its command and outputs) over a toy model and problems. The
first attempt is the stage's own command with one change: it SIGKILLs itself right after the checkpoint of step 2
of 3 (a deterministic point; the kill is real). The newest checkpoint's weights are then cut short; `dvc repro`
resumes from the one before, and `dvc repro -f` (a finished run asked to run again) trains from step 0: both must
end with the same weights and the same per-step metrics. Then the same kill, the history lost: `dvc repro` stops
with one line naming it, and the next `dvc repro` trains from step 0 to the same result. Six stage runs: 122 s of
CPU (the test's first two phases alone, before: 60 s), about two minutes on 2 idle cores.
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
from mlflow import MlflowClient
from safetensors.torch import load_file

from flows.tracking import INVOCATION_TAG
from pipeline.tracking.runs import RESUMED_BY_TAG, RESUMED_FROM_TAG
from pipeline.training_run.checkpoint import read_state
from tests.helpers.workspace import subprocess_env
from tests.train.toy_task import build_direct_model, toy_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]  # six stage runs: ~2 min on 2 idle cores

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
    params = toy_config(ws, ws / "model", group_size=4, steps=STEPS, checkpoints__every=1).model_dump(mode="json")
    params["run"]["tracking_uri"] = "sqlite:///mlruns.db"
    params["train"] |= {"train_file": "train.jsonl", "init_model": "model",
                        "output_dir": "models/policy"}
    params["train"]["checkpoints"]["dir"] = "runs/train"
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


def killed_after_checkpoint(ws: Path, env: dict[str, str]) -> Path:
    """The stage's command, SIGKILLed right after its checkpoint of step KILL_AFTER; the run's folder."""
    killed = run_in(ws, [sys.executable, "-c", KILLED_ATTEMPT, str(KILL_AFTER)], env)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run_dir,) = (ws / "runs" / "train").iterdir()
    assert (run_dir / "checkpoints" / f"step-{KILL_AFTER:06d}" / "manifest.json").is_file()
    return run_dir


def assert_run_tree(ws: Path, killed_run: str) -> None:
    """The killed attempt's run is KILLED; the parent of the `dvc repro` that resumed holds the train run that
    finished, and that run holds every step of the history once."""
    client = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}")
    killed = client.get_run(killed_run)
    (parent,) = client.search_runs([killed.info.experiment_id], f"tags.{INVOCATION_TAG} != ''")
    (train,) = client.search_runs([killed.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert (killed.info.status, parent.info.status, train.info.status) == ("KILLED", "FINISHED", "FINISHED")
    assert train.data.tags[RESUMED_FROM_TAG] == killed_run and killed.data.tags[RESUMED_BY_TAG] == train.info.run_id
    rows = [json.loads(line) for line in (ws / "metrics" / "train_history.jsonl").read_text().splitlines()]
    for key in sorted({k for row in rows for k in row} - {"step"}):
        logged = sorted((m.step, m.value) for m in client.get_metric_history(train.info.run_id, key))
        assert logged == [(row["step"], row[key]) for row in rows if key in row], key  # each step once


def test_a_killed_training_resumes_under_dvc_repro_and_ends_as_an_uninterrupted_run(
        workspace: Path, prefect_server: str, tmp_path: Path) -> None:
    ws, env = workspace, subprocess_env(prefect_server, tmp_path / "prefect-home")
    dvc = str(Path(sys.executable).with_name("dvc"))

    run_dir = killed_after_checkpoint(ws, env)
    assert not (ws / "models" / "policy").exists()
    newest = run_dir / "checkpoints" / f"step-{KILL_AFTER:06d}"
    killed_run = read_state(newest).mlflow_run_id
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])  # looks complete; a full disk or a partial copy cut it

    resumed = run_in(ws, [dvc, "repro"], env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert f"resuming the interrupted run in {run_dir.relative_to(ws)} from step-{KILL_AFTER - 1:06d}" in log, log[-3000:]
    assert f"not from the newer step-{KILL_AFTER:06d}: model.safetensors holds 4096 bytes" in log, log[-3000:]
    assert "removes the checkpoints" not in log and "Traceback" not in log
    history, weights = outputs(ws)
    assert sorted(history) == list(range(STEPS))  # the steps before the kill too, though DVC removed the outputs
    assert (run_dir / "finished.json").is_file()
    assert_run_tree(ws, killed_run)

    again = run_in(ws, [dvc, "repro", "-f"], env)  # a finished run, run again: from step 0
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    log = again.stdout + again.stderr
    assert "finished; training it again from step 0" in log and "removes the checkpoints" in log, log[-3000:]
    straight_history, straight_weights = outputs(ws)
    assert history == straight_history
    assert sorted(weights) == sorted(straight_weights)
    assert all(torch.equal(weights[name], straight_weights[name]) for name in weights)

    run_dir = killed_after_checkpoint(ws, env)  # killed again; then the run's history is lost
    (run_dir / "history.jsonl").unlink()
    stopped = run_in(ws, [dvc, "repro"], env)
    assert stopped.returncode != 0
    log = stopped.stdout + stopped.stderr
    said = [line for line in log.splitlines() if line.startswith("train: ")]
    assert len(said) == 1 and said[0].startswith(f"train: no checkpoint in {run_dir.relative_to(ws)}/checkpoints can "
                                                 "be resumed exactly"), log[-3000:]
    assert f"the run's history is missing (neither {run_dir.relative_to(ws)}/history.jsonl nor" in said[0]
    assert "Traceback" not in log
    retried = run_in(ws, [dvc, "repro"], env)  # does not fail the same way: trains from step 0, and says so
    assert retried.returncode == 0, retried.stdout[-3000:] + retried.stderr[-3000:]
    log = retried.stdout + retried.stderr
    assert "removes the checkpoints an earlier attempt left: step-000001.rejected, step-000002.rejected" in log
    history, weights = outputs(ws)
    assert history == straight_history
    assert all(torch.equal(weights[name], straight_weights[name]) for name in weights)
