"""Checkpoints belong to one run: each config trains in its own folder, retention counts only that run's
checkpoints, `--resume` refuses checkpoints written under another config (naming every differing key), and
exporting a checkpoint that is not there names it and lists the ones that are."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.export import CheckpointNotFound, export_checkpoint
from pipeline.export import main as export_cli
from pipeline.paths import REPO_ROOT
from pipeline.train import run, set_up
from pipeline.training_run.checkpoint import read_state
from pipeline.training_run.folder import (NOT_IDENTITY, RUN_CONFIG, ConfigMismatch, check_resumable, config_name,
                                          run_folder, take, training_identity)
from pipeline.training_run.plan import plan_run
from tests.train.toy_task import build_direct_model, toy_config

pytestmark = pytest.mark.integration  # training runs of two configs

# Keys that change what a run computes, each with another valid value.
IDENTITY_CHANGES = {"train.steps": 7, "train.optimizer.lr": 3e-6, "run.seed": 5, "rollout.group_size": 2,
                    "reward.format_penalty": -0.5, "train.algorithm.eps_high": 0.3, "train.update.autocast": "none",
                    "distributed.zero_stage": 3, "distributed.nproc_per_node": 2,
                    "sandbox.timeout_s": 9.0}
# Keys that only say where things go or how fast: a resume may change them.
BOOKKEEPING_CHANGES = {"train.checkpoints.every": 5, "train.output_dir": "elsewhere", "run.tracking_uri": "sqlite:///x.db",
                       "run.torch_threads": 3, "sandbox.port": 8123, "train.sample_tables.trajectories": 2,
                       "train.checkpoints.log_full": True, "model.device": "cpu", "train.checkpoints.dir": "other",
                       "distributed.launcher": "deepspeed", "distributed.master_addr": "node-1"}


def params(**overrides: object):
    return load_config(REPO_ROOT / "params.yaml", overrides=dict(overrides))


@pytest.mark.parametrize(("key", "value"), list(IDENTITY_CHANGES.items()))
def test_a_setting_that_changes_the_run_changes_its_folder(key: str, value: object) -> None:
    assert config_name(training_identity(params(**{key: value}))) != config_name(training_identity(params()))


@pytest.mark.parametrize(("key", "value"), list(BOOKKEEPING_CHANGES.items()))
def test_where_and_how_fast_do_not_change_the_run(key: str, value: object) -> None:
    assert config_name(training_identity(params(**{key: value}))) == config_name(training_identity(params()))
    assert key.startswith(NOT_IDENTITY)


def test_the_folder_is_named_by_the_config_or_given_a_name() -> None:
    cfg = params()
    assert run_folder(cfg) == Path("runs/train") / config_name(training_identity(cfg))
    assert re.fullmatch(r"cfg-[0-9a-f]{10}", run_folder(cfg).name)
    assert run_folder(cfg, "exp: lr 3e-6/b") == Path("runs/train/exp-lr-3e-6-b")  # one path component


@pytest.mark.parametrize(("written_on", "resumed_on"), [(8, 4), (1, 2), (4, 8)])
def test_an_auto_rank_count_is_the_one_it_resolved_to(monkeypatch, tmp_path: Path, written_on: int,
                                                      resumed_on: int) -> None:
    """`nproc_per_node: auto` written on one machine and resumed on another with a different GPU count is refused,
    naming both counts; inside a rank the launcher's count names the same folder as the stage's view."""
    for var in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(var, raising=False)
    distributed = {"distributed.enabled": True}
    monkeypatch.setattr("pipeline.training_run.folder.visible_gpus", lambda: written_on)
    written = training_identity(params(**distributed))
    assert written["distributed.nproc_per_node"] == written_on
    single = training_identity(params())  # one process: the machine's GPUs do not change the run
    monkeypatch.setattr("pipeline.training_run.folder.visible_gpus", lambda: resumed_on)
    assert training_identity(params()) == single
    monkeypatch.setattr("pipeline.training_run.folder.visible_gpus", lambda: written_on)
    for var in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):  # torchrun's and DeepSpeed's ranks see what the stage saw
        monkeypatch.setenv(var, str(written_on))
        assert training_identity(params(**distributed)) == written
        monkeypatch.delenv(var)
    take(tmp_path, written, resume=False)
    saved(tmp_path, "step-000004")
    monkeypatch.setattr("pipeline.training_run.folder.visible_gpus", lambda: resumed_on)
    with pytest.raises(ConfigMismatch, match=f"distributed.nproc_per_node: {written_on} in the checkpoints, "
                                             f"{resumed_on} now"):
        check_resumable(tmp_path, training_identity(params(**distributed)))


def test_auto_with_a_hostfile_stays_auto(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-0 slots=8\nnode-1 slots=8\n")
    cfg = params(**{"distributed.enabled": True, "distributed.hostfile": str(hostfile), "distributed.nnodes": 2,
                    "distributed.launcher": "deepspeed"})
    assert training_identity(cfg)["distributed.nproc_per_node"] == "auto"


def saved(folder: Path, *names: str) -> None:
    for name in names:
        (folder / "checkpoints" / name).mkdir(parents=True)


@pytest.mark.parametrize("changes", [{"train.steps": 3}, {"train.optimizer.lr": 3e-6, "rollout.group_size": 2},
                                     dict(list(IDENTITY_CHANGES.items())[:5])], ids=["one", "two", "five"])
def test_a_resume_under_another_config_names_every_differing_key(tmp_path: Path, changes: dict) -> None:
    written, resuming = training_identity(params()), training_identity(params(**changes))
    take(tmp_path, written, resume=False)
    saved(tmp_path, "step-000004")
    with pytest.raises(ConfigMismatch) as err:
        check_resumable(tmp_path, resuming)
    message = str(err.value)
    assert f"{len(changes)} key(s) differ" in message and str(tmp_path / RUN_CONFIG) in message
    for key in changes:
        assert f"{key}: {json.dumps(written[key])} in the checkpoints, {json.dumps(resuming[key])} now" in message
    check_resumable(tmp_path, written)  # the config they were written under resumes


def test_checkpoints_of_unknown_config_are_refused_and_an_empty_folder_is_a_first_run(tmp_path: Path) -> None:
    identity = training_identity(params())
    check_resumable(tmp_path / "never-trained", identity)
    saved(tmp_path, "step-000002")
    with pytest.raises(ConfigMismatch, match=f"has no {RUN_CONFIG}"):
        check_resumable(tmp_path, identity)


def test_a_fresh_run_removes_an_earlier_attempts_checkpoints_and_a_resume_keeps_them(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    identity = training_identity(params())
    take(tmp_path, identity, resume=False)
    saved(tmp_path, "step-000002", "step-000004", "step-000006.tmp")
    take(tmp_path, identity, resume=True)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000002", "step-000004",
                                                                            "step-000006.tmp"]
    take(tmp_path, identity, resume=False)
    assert not (tmp_path / "checkpoints").exists()
    assert "step-000002, step-000004, step-000006.tmp" in capsys.readouterr().err
    assert json.loads((tmp_path / RUN_CONFIG).read_text()) == identity


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A 3-step and a 2-step run of the toy model sharing one train.checkpoints.dir, one checkpoint a step."""
    base = tmp_path_factory.mktemp("runs")
    model_dir = build_direct_model(base / "model")
    configs = {}
    for steps in (3, 2):  # as `dvc repro` and then `dvc exp run -S train.steps=2` would
        cfg = toy_config(base, model_dir, group_size=4, steps=steps, checkpoints__every=1, lr=1e-3,
                         checkpoints__dir=str(base / "ckpt"), output_dir=str(base / f"policy{steps}"))
        run(cfg, {}, metrics_dir=base / f"metrics{steps}")
        configs[steps] = cfg
    return base, configs


def test_runs_of_two_configs_keep_their_own_last_checkpoints(two_runs: tuple[Path, dict]) -> None:
    base, configs = two_runs
    folders = {steps: run_folder(cfg) for steps, cfg in configs.items()}
    assert folders[3] != folders[2] and {f.parent for f in folders.values()} == {base / "ckpt"}
    kept = {steps: sorted(p.name for p in (f / "checkpoints").iterdir()) for steps, f in folders.items()}
    assert kept == {3: ["step-000002", "step-000003"], 2: ["step-000001", "step-000002"]}


def test_resuming_another_configs_run_is_refused_before_training(two_runs: tuple[Path, dict]) -> None:
    _, configs = two_runs
    other = run_folder(configs[3]).name  # e.g. the same DVC experiment name reused with other params
    with pytest.raises(ConfigMismatch, match=r"1 key\(s\) differ: train\.steps: 3 in the checkpoints, 2 now"):
        metrics_dir = Path(configs[2].train.output_dir + "-resumed")
        run(configs[2], {}, plan_run(configs[2], name=other, metrics_dir=metrics_dir, mode="insisted"),
            metrics_dir=metrics_dir)
    assert sorted(p.name for p in (run_folder(configs[3]) / "checkpoints").iterdir()) == ["step-000002",
                                                                                          "step-000003"]


def test_a_run_starts_from_the_checkpoint_its_plan_names(two_runs: tuple[Path, dict]) -> None:
    """Not from whatever is newest: the stage chose the checkpoint (and a data-parallel rank is handed the same
    plan), so what the run loads is the plan's."""
    _, configs = two_runs
    older = run_folder(configs[3]) / "checkpoints" / "step-000002"
    t = set_up(configs[3], {}, replace(plan_run(configs[3]), resume=True, start_from=older))
    try:
        assert (t.start.step, t.stream.cursor) == (2, read_state(older).data_cursor)
        assert sorted(p.name for p in (run_folder(configs[3]) / "checkpoints").iterdir()) == ["step-000002",
                                                                                              "step-000003"]
    finally:
        t.engine.close()


def test_exporting_a_checkpoint_that_is_not_there_lists_those_that_are(
        two_runs: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    _, configs = two_runs
    pruned = run_folder(configs[3]) / "checkpoints" / "step-000001"
    existing = [run_folder(configs[steps]) / "checkpoints" / name
                for steps, name in ((3, "step-000002"), (3, "step-000003"), (2, "step-000001"), (2, "step-000002"))]
    with pytest.raises(CheckpointNotFound) as err:
        export_checkpoint(pruned, tmp_path / "out", configs[3].train, configs[3].model.dtype)
    assert str(err.value).startswith(f"{pruned}: no such checkpoint")
    assert all(str(path) in str(err.value) for path in existing)
    monkeypatch.setattr(sys, "argv", ["export", str(pruned), str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exit_:
        export_cli()
    printed = capsys.readouterr().err
    assert exit_.value.code == 1 and printed.count("\n") == 1 and "Traceback" not in printed
    assert printed.startswith(f"export: {pruned}: no such checkpoint") and str(existing[0]) in printed
    assert not (tmp_path / "out").exists()
