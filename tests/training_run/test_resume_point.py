"""Resume is exact or loud: a resume continues from the newest checkpoint whose state is all there and consistent
(its files against the manifest written last, the run's history of every step before it, the very rows the
checkpoint was saved after), names each checkpoint it passes over and why, and when none is usable stops with one
line naming them, having set them aside so that a retry does not fail the same way again.

Checkpoints here are real (`save_checkpoint` of a tiny module); every case runs in milliseconds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.tracking.history import TRAIN_HISTORY, HistoryGap, MetricHistory, recorded_history
from pipeline.training_run.checkpoint import REJECTED, latest_checkpoint, prune
from pipeline.training_run.manifest import MANIFEST, problem, read_manifest
from pipeline.training_run.resume_point import UnusableCheckpoints, find_resume_point, run_history, settle
from pipeline.training_run.folder import CHECKPOINTS, HISTORY
from tests.helpers.checkpoints import history_rows, history_text, write_checkpoints, write_history

STEPS = (2, 3)  # the two checkpoints a run keeps; the killed attempt logged steps 3 and 4 after the last one


def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    write_checkpoints(folder, STEPS)
    return folder


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / CHECKPOINTS).iterdir())


# history as found -> the checkpoint a resume continues from (None: it stops)
HISTORIES = {
    "whole": (lambda rows: history_text(rows), 3),
    "cut-by-a-kill-mid-line": (lambda rows: history_text(rows[:3]) + '{"step": 3, "rew', 3),
    "truncated-before-step-2": (lambda rows: history_text(rows[:2]), 2),
    "truncated-before-step-1": (lambda rows: history_text(rows[:1]), None),
    "empty": (lambda rows: "", None),
    "gap-at-step-1": (lambda rows: history_text([rows[0], *rows[2:]]), None),
    "gap-at-step-2": (lambda rows: history_text([*rows[:2], *rows[3:]]), 2),
    "damaged-line-at-step-2": (lambda rows: history_text(rows[:2]) + "not json\n" + history_text(rows[3:]), 2),
    "another-runs-numbers": (lambda rows: history_text(history_rows(5, offset=0.5)), None),
    "step-2-edited": (lambda rows: history_text([*rows[:2], rows[2] | {"reward/mean": 9.0}, *rows[3:]]), 2),
}


@pytest.mark.parametrize("case", list(HISTORIES))
def test_the_history_decides_which_checkpoint_can_be_resumed(tmp_path: Path, case: str) -> None:
    folder = run_dir(tmp_path)
    make, expected = HISTORIES[case]
    (folder / HISTORY).write_text(make(history_rows(5)))
    history = run_history(folder, tmp_path / "metrics")
    point = find_resume_point(folder, history)
    assert (point.checkpoint.name if point.checkpoint else None) == (f"step-{expected:06d}" if expected else None)
    passed_over = [r.checkpoint.name for r in point.rejected]
    assert passed_over == [f"step-{s:06d}" for s in sorted(STEPS, reverse=True) if expected is None or s > expected]
    assert all(str(folder / HISTORY) in r.reason for r in point.rejected)  # the file is named


def test_without_a_history_every_checkpoint_is_refused_naming_both_places_looked_in(tmp_path: Path) -> None:
    folder = run_dir(tmp_path)
    with pytest.raises(UnusableCheckpoints) as err:
        settle(folder, run_history(folder, tmp_path / "metrics"))
    message = str(err.value)
    assert "\n" not in message and f"(neither {folder / HISTORY} nor {tmp_path / 'metrics' / TRAIN_HISTORY} exists)" in message
    assert "step-000003: the run's history is missing" in message and "steps 0-2 before it have no metrics" in message
    assert names(folder) == [f"step-000002{REJECTED}", f"step-000003{REJECTED}"]


def test_the_stage_output_serves_when_the_runs_copy_is_gone(tmp_path: Path) -> None:
    folder = run_dir(tmp_path)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / TRAIN_HISTORY).write_text(history_text(history_rows(4)))
    assert find_resume_point(folder, run_history(folder, tmp_path / "metrics")).checkpoint.name == "step-000003"


def test_a_fallback_sets_the_newer_checkpoint_aside_and_says_why(tmp_path: Path, capsys) -> None:
    folder = run_dir(tmp_path)
    write_history(folder, history_rows(2))  # lost its tail: step 2 is missing
    point = settle(folder, run_history(folder, tmp_path / "metrics"))
    assert point.checkpoint == folder / CHECKPOINTS / "step-000002"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resuming from step-000002, not from the newer step-000003" in err
    assert "lacks step(s) 2 of the 3 before it" in err and f"step-000003{REJECTED}" in err
    assert names(folder) == ["step-000002", f"step-000003{REJECTED}"]
    assert latest_checkpoint(folder) == point.checkpoint  # every later reader sees the one chosen as the latest


def test_nothing_usable_stops_once_and_a_retry_does_not_loop(tmp_path: Path) -> None:
    folder = run_dir(tmp_path)
    write_history(folder, history_rows(5))
    for checkpoint in STEPS:  # both truncated, as a full disk or a partial copy leaves them
        weights = folder / CHECKPOINTS / f"step-{checkpoint:06d}" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:40])
    with pytest.raises(UnusableCheckpoints) as err:
        settle(folder, run_history(folder, tmp_path / "metrics"))
    message = str(err.value)
    assert "\n" not in message and message.count("model.safetensors holds 40 bytes, the manifest says") == 2
    assert "step-000003: " in message and "step-000002: " in message and "rename them back" in message
    again = settle(folder, run_history(folder, tmp_path / "metrics"))  # the retry: nothing left to resume
    assert again.checkpoint is None and again.rejected == ()
    assert names(folder) == [f"step-000002{REJECTED}", f"step-000003{REJECTED}"]


def test_a_checkpoint_without_its_manifest_is_torn_and_passed_over(tmp_path: Path, capsys) -> None:
    folder = run_dir(tmp_path)
    write_history(folder, history_rows(5))
    (folder / CHECKPOINTS / "step-000003" / MANIFEST).unlink()
    point = settle(folder, run_history(folder, tmp_path / "metrics"))
    assert point.checkpoint.name == "step-000002" and point.torn == (folder / CHECKPOINTS / "step-000003",)
    assert f"step-000003 (killed while saving: no {MANIFEST})" in capsys.readouterr().err


def test_a_resume_that_set_aside_everything_names_them_when_it_trains_from_step_0(tmp_path: Path) -> None:
    from pipeline.training_run.plan import decide_resume

    folder = run_dir(tmp_path)
    with pytest.raises(UnusableCheckpoints):
        settle(folder, run_history(folder, tmp_path / "metrics"))
    decision = decide_resume(folder, {}, {}, run_history(folder, tmp_path / "metrics"))
    assert not decision.resume and f"set aside by an earlier resume: step-000002{REJECTED}" in decision.reason


def test_a_checkpoint_set_aside_is_removed_once_the_run_saves_its_step_again(tmp_path: Path) -> None:
    folder = run_dir(tmp_path) / CHECKPOINTS
    for step in STEPS:
        (folder / f"step-{step:06d}").rename(folder / f"step-{step:06d}{REJECTED}")
    (folder / "step-000001").mkdir()
    prune(folder, 2)
    assert sorted(p.name for p in folder.iterdir()) == ["step-000001", f"step-000003{REJECTED}"]


# Damage to any byte of any file of a checkpoint: cut short, a byte changed, bytes added, the file gone.
DAMAGE = st.sampled_from(["truncate", "flip", "append", "delete"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), damage=DAMAGE)
def test_any_damage_to_a_checkpoint_file_is_found_and_names_the_file(tmp_path: Path, data, damage: str) -> None:
    pristine = tmp_path / "pristine"
    if not pristine.exists():
        write_checkpoints(pristine, (1,))
    folder = tmp_path / "copy"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(pristine / CHECKPOINTS / "step-000001", folder)
    assert problem(folder) is None
    name = data.draw(st.sampled_from(sorted([*read_manifest(folder), MANIFEST])), label="file")
    path = folder / name
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[: data.draw(st.integers(0, len(blob) - 1), label="keep")])
    elif damage == "flip":
        at = data.draw(st.integers(0, len(blob) - 1), label="at")
        path.write_bytes(blob[:at] + bytes([blob[at] ^ data.draw(st.integers(1, 255), label="xor")]) + blob[at + 1:])
    elif damage == "append":
        path.write_bytes(blob + data.draw(st.binary(min_size=1, max_size=64), label="extra"))
    else:
        path.unlink()
    found = problem(folder)
    assert found is not None
    if name != MANIFEST:  # a damaged manifest is named, or the entry it no longer matches
        assert found.startswith(name), found


def test_the_manifest_is_written_last_and_lists_every_file(tmp_path: Path) -> None:
    (checkpoint,) = write_checkpoints(tmp_path, (1,))
    files = sorted(p.name for p in checkpoint.iterdir())
    assert files == sorted(["model.safetensors", "trainer.pt", "state.json", MANIFEST])
    listed = json.loads((checkpoint / MANIFEST).read_text())["files"]
    assert sorted(listed) == sorted(set(files) - {MANIFEST})
    assert all(listed[n]["size"] == (checkpoint / n).stat().st_size for n in listed)
    assert (checkpoint / MANIFEST).stat().st_mtime_ns >= max((checkpoint / n).stat().st_mtime_ns for n in listed)


@pytest.mark.parametrize(("rows", "resume_at"), [(0, 3), (2, 3), (3, 3)])
def test_the_history_refuses_to_resume_over_missing_steps(tmp_path: Path, rows: int, resume_at: int) -> None:
    path = tmp_path / TRAIN_HISTORY
    if rows:
        path.write_text(history_text(history_rows(rows)))
    if rows < resume_at:
        with pytest.raises(HistoryGap, match=f"resuming at step {resume_at}: "):
            MetricHistory(path, resume_at=resume_at)
    else:
        assert [r["step"] for r in MetricHistory(path, resume_at=resume_at).rows] == list(range(resume_at))


def test_the_checkpoint_records_the_digest_of_the_history_it_was_saved_after(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("pipeline.tracking.history.log_metrics", lambda *args, **kwargs: None)  # no MLflow run here
    history = MetricHistory(tmp_path / TRAIN_HISTORY)
    for row in history_rows(3):
        history.log(row["step"], {k: v for k, v in row.items() if k != "step"})
    from pipeline.tracking.history import history_sha256

    assert history.digest(3) == history_sha256(history_rows(3)) != history.digest(2)
    read_back = recorded_history(tmp_path / TRAIN_HISTORY)
    assert read_back.problem(3, history.digest(3)) is None and read_back.problem(3, history.digest(2)) is not None
