"""`train.checkpoints.resume: auto` resumes a run's folder only when its checkpoints are certainly this run's unfinished work:
a complete checkpoint, the same config, the same inputs (code, problems, initial model, search index, libraries),
and no finished marker. Every combination of those conditions is checked, and each input's digest is shown to
follow what it claims to follow. The per-step history a resume finishes from is kept in the run's folder, so a
resume still has it after DVC removed the stage's outputs."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from pipeline.config import config_from_dict
from pipeline.tracking.history import MetricHistory, recorded_history
from pipeline.training_run.manifest import MANIFEST
from pipeline.training_run.folder import (ATTEMPT_FILES, CHECKPOINTS, HISTORY, INPUTS, RUN_CONFIG, mark_finished,
                                          take, training_identity)
from pipeline.training_run.inputs import code_digest, note_inputs, record_inputs, run_inputs, tree_digest
from pipeline.training_run.plan import decide_resume
from tests.helpers.checkpoints import history_rows, write_checkpoints, write_history

IDENTITY = {"train.optimizer.lr": 0.001, "train.steps": 4}
INPUTS_NOW = {"code": "c0", "train_file": "t0", "init_model": "m0", "search_index": "s0", "library.torch": "2.9"}
CHECKPOINT_STATES = ("none", "torn", "complete")
IDENTITY_STATES = ("same", "other", "unrecorded")
INPUT_STATES = ("same", "code", "train_file", "init_model", "search_index", "library.torch", "unrecorded")


def make_folder(folder: Path, checkpoint: str, finished: bool, identity: str, inputs: str) -> None:
    folder.mkdir(parents=True)
    if checkpoint != "none":
        (step,) = write_checkpoints(folder, (2,))
        write_history(folder, history_rows(3))
        if checkpoint == "torn":  # the manifest, written last, missing
            (step / MANIFEST).unlink()
    if identity != "unrecorded":
        recorded = IDENTITY if identity == "same" else IDENTITY | {"train.optimizer.lr": 0.01}
        (folder / RUN_CONFIG).write_text(json.dumps(recorded))
    if inputs != "unrecorded":
        record_inputs(folder, INPUTS_NOW if inputs == "same" else INPUTS_NOW | {inputs: "changed"})
    if finished:
        mark_finished(folder, 4)


def history(folder: Path):
    return recorded_history(folder / "no-metrics" / "train_history.jsonl", folder / HISTORY)


@pytest.mark.parametrize(("checkpoint", "finished", "identity", "inputs"),
                         list(itertools.product(CHECKPOINT_STATES, (False, True), IDENTITY_STATES, INPUT_STATES)))
def test_a_folder_is_resumed_only_when_every_condition_holds(tmp_path: Path, checkpoint: str, finished: bool,
                                                             identity: str, inputs: str) -> None:
    folder = tmp_path / "run"
    make_folder(folder, checkpoint, finished, identity, inputs)
    decision = decide_resume(folder, IDENTITY, INPUTS_NOW, history(folder))
    expected = checkpoint == "complete" and not finished and identity == "same" and inputs == "same"
    assert decision.resume is expected, decision.reason
    if expected:
        assert decision.reason.startswith(f"resuming the interrupted run in {folder} from step-000002")
    else:
        assert decision.reason.endswith("training from step 0") or "training it again from step 0" in decision.reason
    if checkpoint == "complete" and not finished and identity == "same" and inputs not in ("same", "unrecorded"):
        assert f"{inputs}: \"changed\" then, " in decision.reason  # the input that changed is named


def test_a_missing_folder_or_a_damaged_config_record_starts_afresh(tmp_path: Path) -> None:
    assert not decide_resume(tmp_path / "never-made", IDENTITY, INPUTS_NOW, history(tmp_path / "never-made")).resume
    folder = tmp_path / "run"
    make_folder(folder, "complete", False, "same", "same")
    (folder / RUN_CONFIG).write_text('{"train.optimizer.lr": ')  # cut by a kill or an editor
    decision = decide_resume(folder, IDENTITY, INPUTS_NOW, history(folder))
    assert not decision.resume and RUN_CONFIG in decision.reason


def test_a_fresh_take_removes_the_earlier_attempts_records_and_a_resume_keeps_them(tmp_path: Path) -> None:
    for resume in (False, True):
        folder = tmp_path / f"run-{resume}"
        make_folder(folder, "complete", True, "same", "same")
        (folder / HISTORY).write_text('{"step": 0}\n')
        take(folder, IDENTITY, resume=resume)
        left = {name for name in ATTEMPT_FILES if (folder / name).exists()}
        assert left == (set(ATTEMPT_FILES) if resume else set())
        assert (folder / CHECKPOINTS).exists() is resume


def _package_tree(root: Path) -> None:
    for package in ("pipeline", "sandbox", "flows"):
        (root / package / "sub").mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
        (root / package / "sub" / "mod.py").write_text(f"X = '{package}'\n")


@pytest.mark.parametrize("package", ["pipeline", "sandbox", "flows"])
def test_the_code_digest_follows_every_training_package_and_nothing_else(tmp_path: Path, package: str) -> None:
    _package_tree(tmp_path)
    before = code_digest(tmp_path)
    (tmp_path / package / "__pycache__").mkdir()
    (tmp_path / package / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "README.md").write_text("docs change")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    assert code_digest(tmp_path) == before  # byte code, docs and tests do not change what trains
    mod = tmp_path / package / "sub" / "mod.py"
    mod.write_text(mod.read_text() + "Y = 1\n")
    edited = code_digest(tmp_path)
    assert edited != before
    (tmp_path / package / "sub" / "new.py").write_text("")
    assert code_digest(tmp_path) != edited  # a new module too
    mod.rename(tmp_path / package / "sub" / "renamed.py")
    assert code_digest(tmp_path) not in (before, edited)


def test_a_file_is_digested_by_content_and_a_folder_by_its_files(tmp_path: Path) -> None:
    problems = tmp_path / "train.jsonl"
    problems.write_text('{"id": 1}\n')
    first = tree_digest(problems)
    os.utime(problems, ns=(1, 1))
    assert tree_digest(problems) == first  # touched, same bytes: the same problems
    problems.write_text('{"id": 2}\n')
    assert tree_digest(problems) != first
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "weights.bin").write_bytes(b"a" * 10)
    digest = tree_digest(model)
    (model / "sub" / "weights.bin").write_bytes(b"b" * 11)  # rewritten: size and time change
    assert tree_digest(model) != digest
    assert tree_digest(tmp_path / "HuggingFaceTB/SmolLM2") == "absent"  # a hub id: the config names it


def test_run_inputs_name_the_configs_files(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text("{}\n")
    (tmp_path / "model").mkdir()
    cfg = config_from_dict({"train": {"train_file": str(tmp_path / "train.jsonl"), "init_model": str(tmp_path / "model")},
                            "search": {"index_dir": str(tmp_path / "index")}})
    inputs = run_inputs(cfg)
    assert inputs["train_file"] == tree_digest(tmp_path / "train.jsonl") and inputs["search_index"] == "absent"
    assert inputs["code"] == code_digest() and inputs["library.torch"] != "absent"
    (tmp_path / "train.jsonl").write_text("{}\n{}\n")
    assert run_inputs(cfg)["train_file"] != inputs["train_file"]


def test_the_resume_mode_is_not_part_of_what_the_run_computes() -> None:
    auto, never = (config_from_dict({"train": {"checkpoints": {"resume": mode}}}) for mode in ("auto", "never"))
    assert training_identity(auto) == training_identity(never)


def test_a_resumed_history_comes_from_the_runs_copy_once_dvc_removed_the_outputs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("pipeline.tracking.history.log_metrics", lambda *args, **kwargs: None)  # no MLflow run here
    out, copy = tmp_path / "metrics" / "train_history.jsonl", tmp_path / "run" / HISTORY
    copy.parent.mkdir()
    history = MetricHistory(out, run_copy=copy)
    for step in range(4):
        history.log(step, {"reward/mean": step / 10})
    assert out.read_text() == copy.read_text() and len(copy.read_text().splitlines()) == 4
    out.unlink()  # DVC removes a stage's outputs before it runs the stage again
    resumed = MetricHistory(out, resume_at=2, run_copy=copy)  # the checkpoint is at step 2: steps 2, 3 run again
    assert [r["step"] for r in resumed.rows] == [0, 1]
    assert out.read_text() == copy.read_text() == "".join(
        json.dumps({"reward/mean": s / 10, "step": s}, sort_keys=True) + "\n" for s in (0, 1))
    fresh = MetricHistory(out, run_copy=copy)
    assert fresh.rows == [] and out.read_text() == copy.read_text() == ""


@pytest.mark.parametrize("line", ['[1, 2]', '{"reward/mean": 1.0}', '{"step": "3"}', '{"step": true}', '7'])
def test_a_history_row_that_is_no_step_record_is_named(tmp_path: Path, line: str) -> None:
    path = tmp_path / "train_history.jsonl"
    path.write_text('{"step": 0}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: not a metrics row"):
        MetricHistory(path, resume_at=3)


def test_an_insisted_resume_names_the_inputs_that_changed_and_records_the_new_ones(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "run"
    make_folder(folder, "complete", False, "same", "same")
    changed = INPUTS_NOW | {"code": "c1", "train_file": "t1"}
    note_inputs(folder, changed, resume=True)  # --resume: continues, but says what changed under it
    err = capsys.readouterr().err
    assert "--resume continues checkpoints trained on other inputs" in err
    assert 'code: "c0" then, "c1" now' in err and 'train_file: "t0" then, "t1" now' in err and "init_model" not in err
    assert json.loads((folder / INPUTS).read_text()) == changed  # later checkpoints are trained on these
    note_inputs(folder, INPUTS_NOW, resume=False)  # a fresh run has nothing to compare
    assert capsys.readouterr().err == "" and json.loads((folder / INPUTS).read_text()) == INPUTS_NOW


@pytest.mark.parametrize("lost", ["history", "weights"])
def test_an_interrupted_run_whose_state_does_not_verify_is_not_resumed_silently(tmp_path: Path, lost: str) -> None:
    """Everything says "resume" (same config and inputs, unfinished), but the history of the steps before the
    checkpoint is gone, or its weights are cut short: the decision stops naming the file, not resume without it."""
    from pipeline.training_run.resume_point import UnusableCheckpoints

    folder = tmp_path / "run"
    make_folder(folder, "complete", False, "same", "same")
    if lost == "history":
        (folder / HISTORY).unlink()
    else:
        weights = folder / CHECKPOINTS / "step-000002" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(UnusableCheckpoints, match=str(folder / HISTORY) if lost == "history" else
                       "step-000002: model.safetensors holds 100 bytes"):
        decide_resume(folder, IDENTITY, INPUTS_NOW, history(folder))
    decision = decide_resume(folder, IDENTITY, INPUTS_NOW, history(folder))  # the next attempt
    assert not decision.resume and "step-000002.rejected" in decision.reason
