"""Resume is total: a training killed with SIGKILL at any critical point and resumed ends with the outputs of
an uninterrupted run (metrics file, curve, history, final model) and an MLflow run that holds each step once;
no output is ever left half-written in place; a resume that finds only torn checkpoints says so and names them.

Each run is a real child process running `pipeline.train.run` (no tools, so every metric of the resumed
run must equal the uninterrupted run's bit for bit, timings aside). The kill is a real SIGKILL that the
child sends itself at the exact point under test (inside the final save, right after the last checkpoint,
inside a checkpoint's save, before the metrics are written), so the test does not race the child.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mlflow import MlflowClient

from flows.train import checkpoints_of_run
from pipeline.config import load_config
from pipeline.tracking.history import HistoryGap, MetricHistory
from pipeline.tracking.runs import RESUMED_BY_TAG, RESUMED_FROM_TAG
from pipeline.outputs import OutputNotWritable
from pipeline.paths import REPO_ROOT
from pipeline.train import run
from pipeline.training_run.checkpoint import TrainerState, latest_checkpoint, read_state
from pipeline.training_run.manifest import write_manifest
from pipeline.training_run.folder import run_folder
from tests.train.toy_task import build_direct_model, toy_config, write_params

pytestmark = pytest.mark.e2e  # faults injected into whole stages

STEPS, CHECKPOINT_EVERY = 2, 1
TIMING = re.compile(r"(wall_s|_s/|seconds|per_s|idle_fraction|latency)")
DRIVER = r"""
import json, os, signal, sys
from pathlib import Path
import pipeline.training_run.checkpoint as checkpoint
import pipeline.train as train
import pipeline.trainer.replicas as replicas
from pipeline.config import load_config
from pipeline.tracking.history import MetricHistory
from pipeline.training_run.plan import plan_run

params, mode, metrics_dir, kill_at = sys.argv[1:5]

def die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if kill_at == "after-last-checkpoint":  # the final save has not begun
    replicas.save_policy = die
elif kill_at == "during-final-save":  # the weights are written, the tokenizer not yet
    def half_saved(weights, model, tokenizer, path):
        weights.export(model).save_pretrained(path, safe_serialization=True)
        die()
    replicas.save_policy = half_saved
elif kill_at == "before-metrics":  # the final model is saved
    train.write_json_durably = die
elif kill_at.startswith("during-checkpoint-"):  # a checkpoint's weights are written, its state not yet
    step, save_model = int(kill_at.rsplit("-", 1)[1]), checkpoint.save_model
    def torn(model, filename, *args, **kwargs):
        save_model(model, filename, *args, **kwargs)
        if f"step-{step:06d}" in filename:
            die()
    checkpoint.save_model = torn
cfg = load_config(params)
plan = plan_run(cfg, metrics_dir=Path(metrics_dir), mode="insisted" if mode == "resume" else "never")  # as the stage
last = train.run(cfg, {}, plan, metrics_dir=Path(metrics_dir))
print(json.dumps(last, sort_keys=True))
"""


def train_child(root: Path, mode: str, kill_at: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", DRIVER, str(root / "params.yaml"), mode, str(root / "metrics"),
                           kill_at], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def new_run(root: Path, model_dir: Path) -> Path:
    """A run folder with its params; every run shares one MLflow database (made once: its set-up is slow)."""
    root.mkdir()
    cfg = toy_config(root, model_dir, group_size=4, steps=STEPS, checkpoints__every=CHECKPOINT_EVERY, lr=1e-3)
    shared = cfg.run.model_copy(update={"tracking_uri": f"sqlite:///{model_dir.parent / 'mlruns.db'}"})
    write_params(cfg.model_copy(update={"run": shared}), root / "params.yaml")
    return root


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not TIMING.search(k)}


def history(root: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (root / "metrics" / "train_history.jsonl").read_text().splitlines()]
    history = {r["step"]: comparable(r) for r in rows}
    assert len(history) == len(rows), "a step is logged twice"  # a resume keeps only the steps before its checkpoint
    return history


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model and an uninterrupted run of it (the outputs every resumed run must reproduce)."""
    base = tmp_path_factory.mktemp("resume")
    model_dir = build_direct_model(base / "model")
    root = new_run(base / "straight", model_dir)
    done = train_child(root, "fresh")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["reward/mean"] is not None
    return model_dir, root


def assert_same_outputs(resumed: Path, straight: Path, resumed_stdout: str) -> None:
    assert history(resumed) == history(straight)
    assert sorted(history(straight)) == list(range(STEPS))
    got, want = (json.loads((r / "metrics" / "train.json").read_text()) for r in (resumed, straight))
    assert got and comparable(got) == comparable(want)
    returned = comparable(json.loads(resumed_stdout.splitlines()[-1]))  # what run() returns: the last step's
    assert returned == {k: v for k, v in history(straight)[STEPS - 1].items() if k != "step"}
    assert (resumed / "metrics" / "train_curve.csv").read_text() == (straight / "metrics" / "train_curve.csv").read_text()
    weights, expected = (load_file(r / "policy" / "model.safetensors") for r in (resumed, straight))
    assert sorted(weights) == sorted(expected) and all(torch.equal(weights[k], expected[k]) for k in expected)
    assert (resumed / "policy" / "tokenizer_config.json").is_file()
    assert not any(p.name.endswith((".tmp", ".old")) for p in resumed.rglob("*")), "a staging file was left"


def assert_logged_once(root: Path, killed_run: str) -> None:
    """The resumed attempt logged into a run of its own, which holds every step of the history once with the
    history's values; the killed attempt's run is KILLED (its process is gone) and names the one that resumed it."""
    client = MlflowClient(load_config(root / "params.yaml").run.tracking_uri)
    killed = client.get_run(killed_run)
    (resumed,) = client.search_runs([killed.info.experiment_id], f"tags.`{RESUMED_FROM_TAG}` = '{killed_run}'")
    assert (killed.info.status, resumed.info.status) == ("KILLED", "FINISHED")
    assert killed.data.tags[RESUMED_BY_TAG] == resumed.info.run_id
    rows = [json.loads(line) for line in (root / "metrics" / "train_history.jsonl").read_text().splitlines()]
    for key in sorted({k for row in rows for k in row} - {"step"}):
        logged = sorted((m.step, m.value) for m in client.get_metric_history(resumed.info.run_id, key))
        assert logged == [(row["step"], row[key]) for row in rows if key in row], key


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["after-last-checkpoint", "during-final-save", "before-metrics",
                                     "during-checkpoint-2"])
def test_killed_at_a_critical_point_and_resumed_reproduces_the_uninterrupted_run(
        straight: tuple[Path, Path], tmp_path: Path, kill_at: str) -> None:
    model_dir, uninterrupted = straight
    root = new_run(tmp_path / "killed", model_dir)
    killed = train_child(root, "fresh", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    if kill_at != "before-metrics":
        assert not (root / "policy").exists(), "a half-written final model was left where the final one goes"
    killed_run = read_state(latest_checkpoint(run_folder(load_config(root / "params.yaml")))).mlflow_run_id
    resumed = train_child(root, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    if kill_at == "during-checkpoint-2":  # resumed from step 1, past the torn step-000002.tmp, and said so
        assert "skipping torn checkpoints" in resumed.stderr and "step-000002.tmp" in resumed.stderr
    assert_same_outputs(root, uninterrupted, resumed.stdout)
    assert_logged_once(root, killed_run)


@pytest.mark.slow
def test_a_resume_that_finds_only_torn_checkpoints_names_them(straight: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, _ = straight
    root = new_run(tmp_path / "torn", model_dir)
    killed = train_child(root, "fresh", "during-checkpoint-1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    folder = run_folder(load_config(root / "params.yaml")) / "checkpoints"
    torn = folder / "step-000001.tmp"
    assert torn.is_dir() and not (folder / "step-000001").exists()
    resumed = train_child(root, "resume")
    assert resumed.returncode != 0
    assert "no complete checkpoint" in resumed.stderr and str(torn) in resumed.stderr
    assert not (root / "policy").exists()
    assert sorted(history(root)) == [0]  # the killed run's step is still on record, not overwritten


def test_a_resume_finishing_the_run_logs_the_checkpoints_its_run_saved(tmp_path: Path) -> None:
    run_dir = run_folder(toy_config(tmp_path, tmp_path / "model"))
    folder = run_dir / "checkpoints"
    for step, run_id in ((2, "earlier-run"), (4, "killed-run"), (6, "killed-run")):
        ckpt = folder / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        for name in ("model.safetensors", "trainer.pt"):
            (ckpt / name).write_bytes(b"x")
        (ckpt / "state.json").write_text(json.dumps(asdict(TrainerState(step, step, step, run_id))))
        write_manifest(ckpt)
        os.utime(ckpt, (0, 0))  # saved long before this (resumed) invocation started
    (folder / "step-000008.tmp").mkdir()  # torn: never logged
    # the resumed attempt's run is a new one; it logs the checkpoints of the attempt it continues
    logged = checkpoints_of_run(run_dir, {"resumed-run", "killed-run"}, started=1e9)
    assert [p.name for p in logged] == ["step-000004", "step-000006"]


@pytest.mark.parametrize("which", ["checkpoints.dir", "output_dir", "metrics"])
def test_an_unwritable_output_folder_stops_the_run_before_any_compute(tmp_path: Path, which: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # nothing can be created below it, not even by root
    overrides = {"train.init_model": str(tmp_path / "no-such-model")}  # reached only after the check
    if which != "metrics":
        overrides[f"train.{which}"] = str(blocker / which)
    cfg = load_config(write_params(toy_config(tmp_path, tmp_path / "model"), tmp_path / "params.yaml"), overrides)
    metrics_dir = blocker / "metrics" if which == "metrics" else tmp_path / "metrics"
    with pytest.raises(OutputNotWritable, match=re.escape(str(blocker))):
        run(cfg, {}, metrics_dir=metrics_dir)


def test_a_history_line_torn_by_a_kill_is_dropped_and_a_damaged_one_named(tmp_path: Path) -> None:
    """A kill mid-write leaves half a line (that step has no checkpoint and runs again); a damaged line in the
    middle is not a kill's doing: a resume that needs it stops, naming file and line."""
    path = tmp_path / "train_history.jsonl"
    path.write_text('{"step": 0, "reward/mean": 0.5}\n{"step": 1, "rew')
    history = MetricHistory(path, resume_at=1)
    assert history.rows == [{"step": 0, "reward/mean": 0.5}] and path.read_text() == '{"reward/mean": 0.5, "step": 0}\n'
    assert history.final_metrics(1) == {"reward/mean": 0.5}
    path.write_text('{"step": 0, "reward/mean": 0.5}\n{"step": 1, "rew')
    with pytest.raises(HistoryGap, match=re.escape(f"{path} lacks step(s) 1 of the 2 before it")):
        MetricHistory(path, resume_at=2)  # a checkpoint after step 1 needs its row
    path.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: not a metrics row")):
        MetricHistory(path, resume_at=2)


@pytest.mark.slow
@pytest.mark.parametrize("lost", ["history", "history-tail", "weights"])
def test_a_resume_without_the_state_it_needs_stops_naming_it(straight: tuple[Path, Path], tmp_path: Path,
                                                             lost: str) -> None:
    """Killed after its last checkpoint (steps 1 and 2 kept); then the history is lost (both copies: DVC removes
    the stage's), or loses its last step, or the newest checkpoint's weights are cut short. The resume falls back
    to the checkpoint its state covers and ends as the uninterrupted run, or, with no such checkpoint, stops
    before training (the library raises; the stage prints it as one line: tests/faults/test_auto_resume.py)."""
    model_dir, uninterrupted = straight
    root = new_run(tmp_path / "killed", model_dir)
    assert train_child(root, "fresh", "after-last-checkpoint").returncode == -signal.SIGKILL
    folder = run_folder(load_config(root / "params.yaml"))
    history = folder / "history.jsonl"
    if lost == "history":
        history.unlink()
        (root / "metrics" / "train_history.jsonl").unlink()
    elif lost == "history-tail":
        history.write_text("".join(history.read_text().splitlines(keepends=True)[:-1]))
    else:
        weights = folder / "checkpoints" / "step-000002" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-7])
    resumed = train_child(root, "resume")
    if lost == "history":
        assert resumed.returncode != 0 and "UnusableCheckpoints: no checkpoint in" in resumed.stderr
        assert f"step-000002: the run's history is missing (neither {history} nor" in resumed.stderr
        assert not (root / "policy").exists()
        return
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    why = "lacks step(s) 1 of the 2 before it" if lost == "history-tail" else "model.safetensors holds"
    assert "resuming from step-000001, not from the newer step-000002: " in resumed.stderr and why in resumed.stderr
    assert_same_outputs(root, uninterrupted, resumed.stdout)
