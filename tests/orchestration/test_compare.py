"""`python -m pipeline.tracking.compare`: one row per top-level run, nested stage metrics gathered into it."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from pipeline.tracking.compare import main
from pipeline.config.run import RunSection
from pipeline.tracking.runs import PARENT_ENV, tracked_run


@pytest.fixture()
def run_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunSection:
    monkeypatch.chdir(tmp_path)
    return RunSection(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", experiment="compare-test")


def _pipeline_run(run_cfg: RunSection, lr: float, train_acc: float, eval_acc: float,
                  monkeypatch: pytest.MonkeyPatch) -> str:
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    with mlflow.start_run(run_name="pipeline", tags={"stage": "pipeline", "git_commit": "abcdef1234"}) as parent:
        pass
    monkeypatch.setenv(PARENT_ENV, parent.info.run_id)
    with tracked_run(run_cfg, "train", {"train": {"lr": lr}}):
        mlflow.log_metrics({"reward/mean": 0.1, "reward/accuracy": train_acc})
    with tracked_run(run_cfg, "evaluate", {}):
        mlflow.log_metrics({"eval/all/accuracy": eval_acc})  # the key pipeline.evaluation logs
    monkeypatch.delenv(PARENT_ENV)
    return parent.info.run_id


def test_table_of_last_runs(run_cfg: RunSection, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    first = _pipeline_run(run_cfg, 1e-6, 0.25, 0.5, monkeypatch)
    second = _pipeline_run(run_cfg, 3e-6, 0.375, 0.625, monkeypatch)
    with tracked_run(run_cfg, "evaluate", {}):  # a stand-alone evaluation is a row of its own
        mlflow.log_metrics({"eval/all/accuracy": 0.75})

    assert main(["--last", "2", "--experiment", run_cfg.experiment, "--tracking-uri", run_cfg.tracking_uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert {"lr", "reward", "train", "acc", "eval"} <= set(header)
    assert len(lines) == 4  # header, rule, two rows: the newest two top-level runs
    assert lines[2].split()[1] == "evaluate"
    assert "0.75" in lines[2]
    assert lines[3].startswith(second[:8]) and "3e-06" in lines[3] and "0.375" in lines[3] and "0.625" in lines[3]
    assert "abcdef12" in lines[3]
    assert first[:8] not in "\n".join(lines)


def test_bad_input_is_a_clear_error(run_cfg: RunSection, capsys: pytest.CaptureFixture[str]) -> None:
    _ = mlflow.set_tracking_uri(run_cfg.tracking_uri)
    assert main(["--experiment", "nope", "--tracking-uri", run_cfg.tracking_uri]) == 1
    assert "no MLflow experiment 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--last", "0"])
    assert main(["--params", "missing.yaml"]) == 1
    assert "missing.yaml" in capsys.readouterr().err
